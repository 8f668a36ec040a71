"""The auditor: the only room that reads private records.

It builds what an attack is judged against — balanced reference sets and
their permutation nulls (:mod:`~fedaudit.audit.identifiability`), the holdout
twin and the positive control of an artifact (:mod:`~fedaudit.audit.counterfactual`)
— and turns stored evidence into the verdict (:mod:`~fedaudit.audit.verdict`).
Attacks never import it.
"""
