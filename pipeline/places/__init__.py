"""Where clients live and how their contributions combine: one process (communicate), torchrun's
processes (distributed, launch). Flower's nodes are the `pipeline.flower` extra, which sits
above the run because it drives the round loop itself."""
