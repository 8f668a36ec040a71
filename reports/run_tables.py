"""The report's tables of one run beside another: accuracy, communication, privacy (DP-SGD, client-level DP, a
recording's declared DP), the ledger, the rounds and provenance — each read from the typed blocks of
:mod:`fedaudit.run`, never recomputed.
"""

from __future__ import annotations

from collections.abc import Sequence

from fedaudit.reports import plots
from fedaudit.reports.cells import (Context, MISSING, Table, aligned, as_text, f3, is_finite, mb, num_text,
                                    rounds_text, signed, size_text, to_float, value_text)
from fedaudit.reports.load import Run, Unit
from fedaudit.reports.summary import verification_text
from fedaudit.run.stored import DP


# -- 2. side by side -------------------------------------------------------------------


def accuracy_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        acc = u.stored.accuracy
        out = [("unseen-domain accuracy (selected round)", f3(acc.unseen_domain)),
               ("selected round (best source validation)", as_text(acc.selected_round))]
        final = acc.final_round
        if final:
            out.append(("unseen-domain accuracy at the final round", f"{f3(final.unseen_domain)} (round {as_text(final.round)})"))
        if acc.rounds_without_deployed_model:
            out.append(("rounds with no deployable model (not scored, never selected)",
                        rounds_text(acc.rounds_without_deployed_model)))
        out.append(("source validation accuracy, mean", f3(acc.source_val.mean)))
        for domain, v in acc.source_val.per_domain.items():
            out.append((f"source validation accuracy, {domain}", f3(v)))
        for k, v in acc.method_specific.items():
            out.append((f"method-specific: {k}", value_text(v)))
        twin = acc.without_canaries
        if twin is not None:
            change = twin.change_with_canaries
            out.append(("the same run without the canary audit's canaries: unseen-domain / source validation",
                        f"{f3(twin.unseen_domain)} / {f3(twin.source_val.mean)} (the "
                        f"canaries changed them by {signed(change.unseen_domain)} / "
                        f"{signed(change.source_val_mean)})"))
        return out

    return aligned(units, cells)


def mean_note(run: Run) -> str:
    acc = run.stored.accuracy
    n = len(run.units)
    return (f"{run.run_dir.name}: mean over its {n} targets as stored in metrics.json — unseen-domain accuracy "
            f"{f3(acc.unseen_domain)}, source validation {f3(acc.source_val.mean)}.")


def communication_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        c = u.stored.communication
        out = [("shares (declared by the method)", ", ".join(c.declared) or MISSING),
               ("rounds × clients", f"{as_text(c.rounds)} × {as_text(c.clients)}"),
               ("MB up per round (clients → server)", f3(c.mb_up_per_round)),
               ("MB down per round (server → clients)", f3(c.mb_down_per_round)),
               ("total up", size_text(c.bytes_up)),
               ("total down", size_text(c.bytes_down))]
        for kind, d in c.by_kind.items():
            for sent, arrow in ((d.up, "↑"), (d.down, "↓")):
                if sent:
                    out.append((f"total, {kind} {arrow}", size_text(sent)))
        return out

    return aligned(units, cells)


def privacy_table(units: Sequence[Unit]) -> Table:
    """The defense in force: DP-SGD's ε per client (the tight accountant's, RDP's beside it), and for every artifact the
    method shares whether that ε covers it — an ε says nothing about what it does not cover."""
    def cells(u: Unit) -> list[tuple[str, str]]:
        privacy = u.stored.privacy
        if privacy is None:
            return [("defense", "not recorded (a run from before fedaudit recorded defenses)")]
        dp = privacy.dp
        if not dp:
            out = [("defense", "none: clients train with plain SGD; no artifact is covered by a privacy guarantee")]
        elif dp.recorded:  # the deployment's own mechanism, read from its recording
            out = _recorded_dp_cells(dp)
        else:
            out = _dp_sgd_cells(dp)
        for row in privacy.coverage:
            arrow = "↑" if row.direction == "up" else "↓"
            verdict = "covered" if row.covered else "NOT covered"
            out.append((f"covered by ε? {as_text(row.artifact)} {arrow}", f"{verdict}: {as_text(row.why)}"))
        return out

    return aligned(units, cells)


def _recorded_dp_cells(dp: DP) -> list[tuple[str, str]]:
    out = [("defense", f"{as_text(dp.mechanism)} ({as_text(dp.source)}): {as_text(dp.clipping)}, "
                       f"the server adds Gaussian noise of std {num_text(dp.noise_std_on_sum)} to the sum "
                       f"of {as_text(dp.num_sampled_clients)} sampled updates (noise multiplier "
                       f"{num_text(dp.noise_multiplier)}, clipping norm {num_text(dp.clipping_norm)}); "
                       f"unit: {as_text(dp.unit)}; neighbours: {as_text(dp.neighbours)}"),
           ("ε", f"{f3(dp.epsilon)} at δ {num_text(dp.delta)} over {as_text(dp.rounds)} "
                 f"rounds ({as_text(dp.accountant)} accountant"
                 + (f"; RDP's bound {f3(dp.epsilon_rdp)}" if is_finite(dp.epsilon_rdp) else "")
                 + f"; {as_text(dp.sampling)})")]
    if dp.weaker_rounds:
        out.append(("noise per client", as_text(dp.weaker_rounds)))
    check = dp.clipping_check
    if check.status in ("held", "violated"):
        out.append(("clipping on the wire", f"{check.status}: {as_text(check.over_norm)} of "
                                            f"{as_text(check.updates)} recorded updates over the clipping "
                                            f"norm; largest {f3(check.max_ratio)}× it ({as_text(check.worst)})"))
    else:
        out.append(("clipping on the wire", f"{as_text(check.status)}: {as_text(check.why)}"))
    if dp.claim:
        out.append(("claim", as_text(dp.claim)))
    return out


def _dp_sgd_cells(dp: DP) -> list[tuple[str, str]]:
    out = [("defense", f"DP-SGD (Opacus), target ε {num_text(dp.epsilon_target)} per client over all rounds, "
                       f"δ {num_text(dp.delta)}, clipping norm {num_text(dp.max_grad_norm)}, "
                       f"{as_text(dp.accountant)} accountant; unit: {as_text(dp.unit)}"
                       + ("; noise from torch's PRNG, not a cryptographic one" if dp.secure_rng is False else ""))]
    if dp.trained_parameters is not None:  # runs from before the DP recipe did not record it
        out.append(("DP-SGD recipe", f"{as_text(dp.augmentations)} augmented view(s) per record; trains "
                                     f"{as_text(dp.trained)} ({as_text(dp.trained_parameters)} parameters, "
                                     f"{as_text(dp.frozen_parameters)} frozen at their initialisation)"))
    for domain, c in dp.clients.items():
        rdp = f"; RDP's bound on the same noise {f3(c.epsilon_rdp)}" if is_finite(c.epsilon_rdp) else ""
        out.append((f"ε spent, {domain}", f"{f3(c.epsilon_spent)}"
                                           + (f" by {as_text(c.accountant)}" if c.accountant else "")
                                           + f" (noise multiplier {f3(c.noise_multiplier)}, "
                                           f"sampling rate {f3(c.sample_rate)}, {as_text(c.steps)} steps, "
                                           f"{as_text(c.records)} records"
                                           + (f", batch {as_text(c.batch_size)}" if c.batch_size is not None else "")
                                           + (f", {as_text(c.step_factor)}× the method's local steps"
                                              if c.step_factor != 1 else "")
                                           + (f"; noise-to-signal per step {f3(c.noise_to_signal)}"
                                              if is_finite(c.noise_to_signal) else "")
                                           + rdp + ")"))
    return out


# -- privacy–utility scatter (compare) ---------------------------------------------------


# -- 3. the ledger ----------------------------------------------------------------------


def wire_table(u: Unit) -> Table | str:
    """Rounds × (kind, direction): MB and message count, from wire.jsonl."""
    if not u.wire:
        return "wire.jsonl is empty or missing: this run recorded no messages"
    cols: list[tuple[str, str]] = []
    cells: dict[tuple[int, str, str], list[int]] = {}
    for row in u.wire:
        key = (str(row.kind), str(row.direction))
        if key not in cols:
            cols.append(key)
        slot = cells.setdefault((int(row.round), *key), [0, 0])
        slot[0] += int(row.bytes)
        slot[1] += 1
    table = Table([f"{k} {'↑' if d == 'up' else '↓' if d == 'down' else d}" for k, d in cols])
    for rnd in sorted({r for r, _, _ in cells}):
        row = []
        for k, d in cols:
            b = cells[(rnd, k, d)] if (rnd, k, d) in cells else None
            row.append(f"{size_text(b[0])} · {b[1]} msg" if b else MISSING)
        table.rows.append((f"round {rnd}", row))
    totals = [sum(v[0] for (r, k, d), v in cells.items() if (k, d) == col) for col in cols]
    counts = [sum(v[1] for (r, k, d), v in cells.items() if (k, d) == col) for col in cols]
    table.rows.append(("all rounds", [f"{size_text(b)} · {n} msg" for b, n in zip(totals, counts)]))
    return table


# -- 4. reconstructions ------------------------------------------------------------------


# -- 5. membership ------------------------------------------------------------------------


# -- 6. over rounds -----------------------------------------------------------------------


def rounds_section(units: Sequence[Unit]) -> Context:
    with_history = [u for u in units if u.history]
    if not with_history:
        return {"acc": None, "bytes": None, "table": None, "why": "history.csv is empty or missing in every run"}
    acc, traffic = [], []
    for u in with_history:
        xs = [r.round for r in u.history]
        acc.append((f"{u.label}: source validation", xs, [to_float(r.val_mean) for r in u.history]))
        acc.append((f"{u.label}: unseen domain", xs, [to_float(r.target) for r in u.history]))
        traffic.append((f"{u.label}: MB up", xs, [mb(r.bytes_up) for r in u.history]))
        traffic.append((f"{u.label}: MB down", xs, [mb(r.bytes_down) for r in u.history]))
    table = aligned(with_history, lambda u: [(f"round {r.round}", (
        f"val {f3(r.val_mean)} · unseen {f3(r.target)} · "
        f"{size_text(r.bytes_up)} ↑ / {size_text(r.bytes_down)} ↓")) for r in u.history])
    return {"acc": plots.rounds_plot(acc, "accuracy", "Accuracy per round", percent=True),
            "bytes": plots.rounds_plot(traffic, "MB", "Traffic per round"), "table": table,
            "why": None if len(with_history) == len(units) else
            "history.csv is missing in: " + ", ".join(u.label for u in units if not u.history)}


# -- 7. provenance ------------------------------------------------------------------------


def provenance_table(units: Sequence[Unit]) -> Table:
    def cells(u: Unit) -> list[tuple[str, str]]:
        p = u.stored.provenance
        config_file = u.config  # config.json: the command and hash, where metrics.json's provenance lacks them
        out = [("run directory", u.run_dir.name),
               ("command", as_text(p.command or (config_file["command"] if "command" in config_file else None))),
               ("config hash", as_text(p.config_hash
                                       or (config_file["config_hash"] if "config_hash" in config_file else None))),
               ("dataset fingerprint", as_text(p.dataset_fingerprint)),
               ("dataset files skipped (unreadable)", as_text(p.dataset_skipped_files)),
               ("dataset class folders without images", as_text(", ".join(p.dataset_empty_class_folders or [])
                                                                or ("none" if p.dataset_empty_class_folders is not None
                                                                    else None))),
               ("thin splits", as_text("; ".join(p.data_warnings or [])
                                       or ("none" if p.data_warnings is not None else None))),
               ("seed", as_text(p.seed)), ("metrics schema version", as_text(u.stored.schema_version))]
        dev = p.device
        out.append(("device", f"{dev.type} · {dev.name} · {dev.threads} threads"))
        for k, v in p.numerics.items():  # what the numbers depend on beyond the config (docs/gpu.md)
            out.append((f"numerics: {k}", as_text(", ".join(map(str, v)) or "none" if isinstance(v, list) else v)))
        model = p.model
        if model is not None:  # the model trained or audited: fedaudit's architecture or the user's factory
            built = (f"{model.factory}({', '.join(f'{k}={v!r}' for k, v in (model.args or {}).items())}), "
                     f"defined in {model.module_file} (sha256 {model.sha256})" if model.factory else
                     f"fedaudit's {model.architecture} (norm {model.norm})")
            out += [("model", as_text(f"{built}; {model.class_name}, {model.parameters:,} parameters"
                                    if isinstance(model.parameters, int) else built)),
                    ("classifier head (for the attacks)", as_text(model.head_layer or "none found"))]
        recording = p.recording
        if recording:  # `fedaudit audit`: nothing was trained here; the wire is a recorded federation's
            framework = recording.framework_block
            deployed = recording.deployed_model
            out += [("audited recording", as_text(recording.path)),
                    ("recorded with", as_text(f"{framework.name} {framework.version}, run id "
                                            f"{recording.run_id}"
                                            + (f" ({framework.name} run {recording.framework_run_id})"
                                               if recording.framework_run_id is not None else ""))),
                    ("recorded nodes", as_text(", ".join(f"{k} = {v}" for k, v in recording.nodes.items()))),
                    ("recording verified", as_text(verification_text(recording.verification))),
                    ("deployed model", as_text(f"the server's {deployed.message_type} broadcast of round "
                                             f"{deployed.round}"))]
        for k, v in p.versions.items():
            out.append((f"version: {k}", as_text(v)))
        for k, v in p.seconds.items():
            out.append((f"seconds: {k}", value_text(v)))
        return out

    return aligned(units, cells)
