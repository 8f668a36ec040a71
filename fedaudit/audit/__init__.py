"""The auditor: the only room that reads private records.

It builds what an attack is judged against — balanced reference sets and
their permutation nulls (:mod:`~fedaudit.audit.identifiability`), the holdout
twin and the positive control of an artifact (:mod:`~fedaudit.audit.counterfactual`),
every reconstruction's scores beside its nulls and its power
(:mod:`~fedaudit.audit.reconstruction`), the membership challenges, the
deployed model's query access and the scores split by the kept truth
(:mod:`~fedaudit.audit.membership`), the planted canaries and their ε bound
(:mod:`~fedaudit.audit.canary`) — and turns the stored evidence into the
verdict (:mod:`~fedaudit.audit.verdict`). It grants each attack the
:class:`~fedaudit.attack.Access` its ``needs`` names and nothing more. Attacks
never import it (``tests/test_layout.py``).
"""
