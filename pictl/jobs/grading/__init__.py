"""Results a TA can verify: a run as one signed file (`bundle`), its checks and re-run (`verify`), and a class's
bundles side by side (`board`). Above the run layer: a verification re-runs the bundle's configuration."""
