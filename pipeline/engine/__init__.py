"""How local training and inference run. Algorithms never see these details.

Models travel as flat vectors (one row of a (K, P) tensor per model: the parameters, then the
floating-point buffers such as BatchNorm statistics), so aggregation is a weighted sum of rows and
a checkpoint is one tensor.
"""

from pipeline.engine.batched import BatchedExecutor
from pipeline.engine.sequential import SequentialExecutor
from pipeline.engine.task import LocalResult, LocalTask

__all__ = ["BatchedExecutor", "LocalResult", "LocalTask", "SequentialExecutor"]
