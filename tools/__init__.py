"""Tools of this repository that are not shipped in the wheel: the chaos harness
(``make chaos``, :mod:`tools.chaos`)."""
