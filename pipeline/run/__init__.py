"""A training run: the round loop (training), its configuration (resolve), what it holds on one
place (setup), where clients' parts run (clients), the momentum kept per client (momentum), and
everything its folder holds (folder, files, log, live, checkpoints, derived)."""
