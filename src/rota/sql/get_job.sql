SELECT * FROM {schema}.jobs WHERE id = %(id)s
