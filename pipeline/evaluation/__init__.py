"""Scoring models: held-out E-steps and accuracies (accuracy), a drifting run step by step
(drift_scores)."""
