"""Measuring, on one harness (`harness`: climb the rungs, guard a rung, time a step): the bench and its
`best` and batch-size searches, parity of the loss, the profile, scaling over GPUs, the doctor's checks."""
