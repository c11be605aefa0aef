"""rota.errors: one-line reports of exceptions, and the admin errors' attributes."""

from __future__ import annotations

from rota import InvalidInput, InvalidTransition, JobNotFound
from rota.errors import first_line


def test_first_line_is_the_first_line_of_the_message_or_the_type() -> None:
    assert first_line(ValueError("  bad value \n  more detail\n")) == "bad value"
    assert first_line(ValueError("bad value\nmore"), with_type=True) == "ValueError: bad value"
    assert first_line(KeyError("x"), with_type=True) == "KeyError: 'x'"
    assert first_line(RuntimeError()) == "RuntimeError"
    assert first_line(RuntimeError("  \n "), with_type=True) == "RuntimeError"


def test_admin_errors_are_invalid_input_with_the_job_and_its_status() -> None:
    missing = JobNotFound(7)
    assert (str(missing), missing.job_id) == ("no job 7", 7)
    refused = InvalidTransition("job 7 is done; only a failed job can be retried",
                                job_id=7, status="done")
    assert (refused.job_id, refused.status) == (7, "done")
    assert isinstance(missing, InvalidInput) and isinstance(refused, ValueError)
