"""Many runs, one page: the DP sweep (``--dp-sweep``) and grids of runs (``fedaudit sweep``, on Ray)."""
