"""fedrc on Flower's deployment engine (the optional `flower` extra: `pip install fedrc[flower]`).

The server holds the algorithm and runs fedrc's own round loop (`pipeline.run.training`); the
SuperNodes hold the clients' shards and run the local work it asks for: E-step and evaluation
logits, and local training. Nothing here is imported unless Flower is used.
"""
