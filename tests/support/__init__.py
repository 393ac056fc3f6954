"""What the tests share and are not tests: a `pictl` runner, local and SSH clusters, data-set fixtures.

Fixtures live in `tests/conftest.py`; the helpers they and the tests call live here, imported as
`support.<module>` (pytest puts `tests/` on the path for its root conftest).
"""
