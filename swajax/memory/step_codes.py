"""The integer codes in a step's inputs (no JAX: the host planner writes them, `commit_step`
reads them)."""

FREE_SWA, FREE_FULL, REPOINT = 1, 2, 3  # edit kinds (0: padding)
# A `last_loc` the step reads from req_to_token itself: a step planned while the previous one
# still ran does not know the slot that step allocated; the row does.
LAST_LOC_ON_DEVICE = -2
