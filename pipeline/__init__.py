"""fedrc's library: data, models, algorithms, execution, evaluation and plots, without the CLI."""
