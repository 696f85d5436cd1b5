"""fedrc's command-line interface: options, help, console output, errors and exit codes."""
