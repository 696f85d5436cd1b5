"""How local training and inference run. Algorithms never see these details.

Models travel as flat parameter vectors (one row of a (K, P) tensor per model), so aggregation
is a weighted sum of rows and a checkpoint is one tensor.
"""

from pipeline.engine.sequential import SequentialExecutor

__all__ = ["SequentialExecutor"]
