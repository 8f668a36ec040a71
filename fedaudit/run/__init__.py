"""The run: its configuration (one declaration per option, one resolve step), seeds, numerics, the run
directory (atomic writes, checkpoints, resume) and the finished run's summary."""
