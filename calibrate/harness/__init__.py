"""The harness: the `python -m calibrate` command (cli), the launchers (launch), the workers' side of
it (worker_io), the cases and the profile rows they leave (record), the fit (fit), and what the
standalone recorders share (recording). The benches and engines rooms build on it."""
