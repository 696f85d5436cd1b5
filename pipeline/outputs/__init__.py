"""What a researcher reads: many runs as one report (report), a run's figures (plots, and
plots_time for a drifting run's timeline)."""
