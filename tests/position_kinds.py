"""How a call names its positions; every layer takes all of these (the `position_kind`
fixture of conftest.py). Kept out of conftest.py: tests/backends has a conftest of its own,
and a test module importing `conftest` by name gets whichever was collected last."""

POSITION_KINDS = ("default", "start_index", "far_start_index", "positions_1d", "positions_2d")
