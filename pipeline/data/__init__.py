"""Datasets, distribution shifts and the Parquet shard format."""
