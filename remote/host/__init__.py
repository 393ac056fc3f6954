"""Host housekeeping: supervise, cleanup, leases, provisioning, the probe (stdlib only, some sent as `python -c`
before any code is pushed), and the warm process (which imports torch once per login)."""
