"""The auditor: the only room that reads private records.

It builds what an attack is judged against — balanced reference sets and
their permutation nulls (:mod:`~fedaudit.audit.identifiability`), the holdout
twin and the positive control of an artifact (:mod:`~fedaudit.audit.counterfactual`),
every reconstruction's scores beside its nulls and its power
(:mod:`~fedaudit.audit.reconstruction`), the planted canaries and their ε
bound (:mod:`~fedaudit.audit.canary`) — and turns the stored evidence into the
verdict (:mod:`~fedaudit.audit.verdict`). Attacks never import it.
"""
