"""What every layer uses: FedrcError (errors), atomic files (io), NaN checks (checks), typed
settings (settings), safe YAML (strict_yaml), name → component (registry), one writer per
folder (run_lock)."""
