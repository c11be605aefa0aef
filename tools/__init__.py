"""Tools of this repository that are not shipped in the wheel: the chaos harnesses
(``make chaos``, :mod:`tools.chaos`; ``make chaos-hosts``, :mod:`tools.chaos_hosts`)."""
