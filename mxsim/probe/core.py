"""The probe engine: decide each datapath key from the unit's answers, emit the hwconfig,
validate it against the unit.

For each probe of :data:`~mxsim.probe.probes.PROBES` in turn, every candidate value is put
into the current hypothesis (every other key as decided so far) and its outputs on the
probe's inputs are predicted with ``mxsim.dot``; the unit is asked only the inputs on which
the candidates disagree (each input at most once per run); the candidates that reproduce
every answer survive and the first of them is kept. The decisive input recorded as evidence
is the answered input that rules out the most other values. After one pass over the probes
a validation on fresh random vectors (realistic data and uniformly random codes) and corners
counts mismatches (when it counts none, also on rows where a decision's equivalent values
disagree with the held hypothesis, :func:`_targeted`, and then on every input the unit has
answered in the run, :func:`_answered`); any mismatching vectors join every probe's inputs
for another pass, in which each decision sees all the others (at most ``refinements`` times,
twice that in the last starts, each followed by a fresh validation). The hypothesis kept is
the one whose validation counted the fewest mismatches (over the main search and, while it
ends with mismatches, a search with the other E8M0 scale placement pinned, one from a coarse
joint start, where products pass fp32's range one from a coarse start that also weighs the
overflow rule, where they pass the output's range the first and the coarse one on rows drawn
inside it, and last a few rounds polishing the hypotheses measured against every answer of
the run at once, :meth:`_Engine.polish`: docs/probe.md), and that count, measured on
vectors its decisions never saw (and on the run's answers), is the one reported. The count
is what was measured on those vectors: nothing is claimed beyond them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import yaml

from ..datapath import parse_hwconfig
from ..datapath.api import dot_with_each_params
from ..datapath.config import check_consistency
from ..datapath.schema import DIRECTED_AND_NEAREST, SCHEMA, keys, param_field
from ..errors import ArgumentError, ConfigError
from ..formats import get_format
from ..limits import check_int
from .inputs import Batch, Context
from .probes import COARSE, COARSE_OVERFLOW, PROBES, Probe, products_pass_fp32
from .units import CountingUnit, ProbeError

#: Most dot products one probe run may ask of the unit.
DEFAULT_BUDGET = 100_000


@dataclass
class Decision:
    probe: str
    keys: tuple[str, ...]
    value: dict
    candidates: int
    asked: int  # inputs the unit answered for this probe (all passes)
    equivalent: list = field(default_factory=list)  # other candidates no answer told apart
    mismatches: int = 0  # answers the kept value misses (0 unless no candidate fits)
    evidence: dict | None = None
    about: str = ""  # what the probe looks at (Probe.what)


@dataclass
class Validation:
    vectors: int
    random: int
    corners: int
    mismatches: int
    nan_payload_differences: int
    examples: list
    targeted: int = (
        0  # rows asked where an equivalent value disagrees with the held one (in vectors)
    )
    answered: int = 0  # earlier answers the config misses (in mismatches, not in vectors)


@dataclass
class ProbeResult:
    """What :func:`probe` found: the config (YAML text and mapping), a decision with its
    evidence per probe, the validation, and the cost (queries, seconds)."""

    config: dict
    yaml: str
    decisions: list
    validation: Validation
    queries: int
    seconds: float
    unit_seconds: float
    passes: int
    stopped: str | None = None  # why the run ended before its last step (None: it ran them all)
    rounding_only: list = field(default_factory=list)  # keys decided only under the rounding probed
    #: How many of the unit's answers in this run (every probe's rows and every validation's)
    #: a config mapping of the same path misses (all of them for a mapping no unit can have).
    misses: Callable[[dict], int] | None = field(default=None, repr=False, compare=False)

    @property
    def exact(self) -> bool:
        """Whether the config missed none of the unit's answers it was checked on."""
        return self.validation.mismatches == 0

    def report(self) -> dict:
        return {
            "config": self.config,
            "exact": self.exact,
            "stopped": self.stopped,
            "decisions": [vars(d) for d in self.decisions],
            "validation": vars(self.validation),
            "rounding_only": self.rounding_only,
            "queries": self.queries,
            "seconds": round(self.seconds, 3),
            "unit_seconds": round(self.unit_seconds, 3),
            "passes": self.passes,
        }


def _key_items():
    """Every key the probe decides: not the output format (given) nor the accepted formats and
    their pairing (the probed pair alone), which no params field holds."""
    for section, name, key in keys():
        if param_field(name, key) is not None and (section, name) != ("output", "format"):
            yield f"{section}.{name}"


class _Engine:
    def __init__(
        self,
        unit: CountingUnit,
        ctx: Context,
        name: str,
        progress=None,
        seconds: float | None = None,
    ):
        self.unit, self.ctx, self.name = unit, ctx, name
        self.progress = progress  # a callable taking one line, or None
        self.started = time.perf_counter()
        self.deadline = None if seconds is None else self.started + seconds
        self.hyp = {}
        for path in _key_items():
            section, key = path.split(".")
            self.hyp[path] = SCHEMA[section][key].default
        self.hyp["inputs.block_size"] = ctx.block_size
        self.hyp["inputs.c_format"] = (
            ctx.c_format
        )  # the format c is asked in: the "c format" probe may widen it
        self.start = dict(self.hyp)
        self.pinned: dict = {}  # key path -> value every candidate must keep (a search with a placement pinned)
        self.refused: set = (
            set()
        )  # scale formats holding codes the unit refused (_unit_answers): no candidate takes them
        self._template = None
        self._params_memo: dict = {}  # hypothesis fields -> resolved params (or None)
        self._hyp_memo: dict = {}  # hypothesis items, in order -> the same (skips the fields)
        self._fields: dict = {}  # key path -> its DatapathParams field
        #: (params, digest of a probe's rows, chunk start) -> the chunk's predictions (read-only):
        #: each pass decides every probe again on the same rows, mostly with the same candidates
        self._predictions: dict = {}
        self._answers: dict = {}
        self._answered: list = []  # (rows, answers) of each batch of new inputs asked, in order

    # -- configs and predictions

    def data(self, hyp: dict, name: str | None = None) -> dict:
        data = {
            "mxsim_hwconfig": 1,
            "name": name or self.name,
            "inputs": {"a_formats": [self.ctx.a_format], "b_formats": [self.ctx.b_format]},
            "output": {"format": self.ctx.out_format},
        }
        for path, value in hyp.items():
            section, key = path.split(".")
            data.setdefault(section, {})[key] = list(value) if isinstance(value, tuple) else value
        return data

    def params(self, hyp: dict):
        """The resolved parameters of a hypothesis, or None for a combination no unit can have
        (the template's parameters with the hypothesis's fields replaced, then checked as the
        loader checks them)."""
        items = tuple(hyp.items())
        try:
            hash(items)
        except TypeError:  # a list value (a term order): as the tuple it stands for
            items = tuple(
                (path, tuple(value) if isinstance(value, list) else value) for path, value in items
            )
        if items not in self._hyp_memo:
            self._hyp_memo[items] = self._resolve(hyp)
        return self._hyp_memo[items]

    def _resolve(self, hyp: dict):
        if self._template is None:
            self._template = parse_hwconfig(self.data(self.hyp), "<probe>").params(
                self.ctx.a_format, self.ctx.b_format, self.ctx.out_format
            )
        fields = {}
        for path, value in hyp.items():
            if path not in self._fields:
                section, key = path.split(".")
                self._fields[path] = param_field(key, SCHEMA[section][key])
            fields[self._fields[path]] = tuple(value) if isinstance(value, list) else value
        memo_key = frozenset(fields.items())
        if memo_key not in self._params_memo:
            params = dataclasses.replace(self._template, **fields)
            try:
                check_consistency(params, "<probe candidate>")
            except ConfigError:
                params = None
            self._params_memo[memo_key] = params
        return self._params_memo[memo_key]

    def predict(self, params, batch: Batch) -> np.ndarray:
        """mxsim's output bits; on rows whose scale codes the candidate's scale format cannot
        hold (E8M0 codes past UE4M3's 7 bits), a value no output has: such a unit could not
        have answered them."""
        return self.predict_each([params], batch)[0]

    def predict_each(self, params_list, batch: Batch) -> list[np.ndarray]:
        """:meth:`predict` of each params on ``batch``: one ``dot_with_each_params`` call per
        scale format (the rows it can hold), so the batch is checked once, not per candidate."""
        outs: list = [None] * len(params_list)
        by_top: dict = {}  # the top scale code a candidate reads (None: no scales) -> candidates
        for i, params in enumerate(params_list):
            top = _top_code(params.scale_format) if params.scales != "none" else None
            by_top.setdefault(top, []).append(i)
        for top, indices in by_top.items():
            readable = (
                ~((batch.scale_a > top).any(axis=1) | (batch.scale_b > top).any(axis=1))
                if top is not None
                else None
            )
            if readable is not None and readable.all():
                readable = None
            rows = batch if readable is None else batch.take(np.flatnonzero(readable))
            bits = (
                dot_with_each_params(
                    [params_list[i] for i in indices],
                    rows.a,
                    rows.b,
                    scale_a=rows.scale_a if top is not None else None,
                    scale_b=rows.scale_b if top is not None else None,
                    c=rows.c.view(self.ctx.c_dtype),
                )
                if len(rows)
                else [np.empty(0, np.uint64)] * len(indices)
            )
            for i, out in zip(indices, bits):
                if readable is None:
                    outs[i] = out.astype(np.uint64)
                else:
                    outs[i] = np.full(len(batch), _unanswerable(self.ctx.out_format), np.uint64)
                    outs[i][readable] = out
        return outs

    # -- asking the unit (each distinct input once)

    def ask(self, batch: Batch) -> np.ndarray:
        keys_ = [
            b"".join(getattr(batch, n)[i].tobytes() for n in ("a", "b", "scale_a", "scale_b", "c"))
            for i in range(len(batch))
        ]
        missing = [i for i, key in enumerate(keys_) if key not in self._answers]
        if missing and self.deadline is not None and time.perf_counter() > self.deadline:
            raise ProbeError(
                f"the probe ran past its time budget of {self.deadline - self.started:g} s"
            )
        if missing:
            rows = batch.take(missing)
            answers = self._unit_answers(rows)
            self._answered.append((rows, answers))
            for i, answer in zip(missing, answers):
                self._answers[keys_[i]] = int(answer)
        return np.array([self._answers[key] for key in keys_], dtype=np.uint64)

    def _unit_answers(self, batch: Batch) -> np.ndarray:
        """The unit's answers. A unit may refuse scale codes that it cannot read (E8M0 codes
        past 127, written once a wrong E8M0 format is held, to a unit reading UE4M3's 7 bits):
        where it raises on a batch holding rows with codes some scale format cannot hold, it is
        asked the other rows alone, and the rows it still refuses get the answer no output has
        (:func:`_unanswerable`): what a candidate whose scale format cannot hold those codes
        predicts, so the refusal is evidence against every format that reads them (recorded in
        ``refused``: no later candidate takes one), not the end of the run. A unit failing on
        the other rows too, or a batch past the budget, still ends it (:class:`ProbeError`)."""

        def answer(rows: Batch) -> np.ndarray:
            return self.unit(rows.a, rows.b, rows.scale_a, rows.scale_b, rows.c)

        try:
            return answer(batch)
        except ProbeError:
            codes = np.maximum(
                batch.scale_a.max(axis=1, initial=0), batch.scale_b.max(axis=1, initial=0)
            )
            unreadable = codes > min(
                _top_code(fmt) for fmt in SCHEMA["inputs"]["scale_format"].choices
            )
            if not unreadable.any() or self.unit.queries + len(batch) > self.unit.budget:
                raise
        answers = np.empty(len(batch), np.uint64)
        if not unreadable.all():
            answers[~unreadable] = answer(batch.take(np.flatnonzero(~unreadable)))
        try:
            answers[unreadable] = answer(batch.take(np.flatnonzero(unreadable)))
        except ProbeError:
            if self.unit.queries + int(unreadable.sum()) > self.unit.budget:
                raise
            answers[unreadable] = _unanswerable(self.ctx.out_format)
            top = int(codes[unreadable].max())
            self.refused |= {
                fmt for fmt in SCHEMA["inputs"]["scale_format"].choices if _top_code(fmt) >= top
            }
        return answers

    def answered(self) -> tuple[Batch, np.ndarray]:
        """Every input the unit has answered in this run, and its answers."""
        return Batch.join([rows for rows, _ in self._answered]), np.concatenate(
            [answers for _, answers in self._answered]
        )

    # -- one probe

    def _chunk_predictions(self, params_list, chunk: Batch, rows: bytes, start: int) -> list:
        """:meth:`predict` of each params on the rows from ``start`` of the batch whose
        :func:`_digest` is ``rows``, kept for the next pass."""
        keys = [(params, rows, start) for params in params_list]
        new = [key for key in dict.fromkeys(keys) if key not in self._predictions]
        for key, out in zip(new, self.predict_each([key[0] for key in new], chunk)):
            out.setflags(write=False)
            self._predictions[key] = out
        return [self._predictions[key] for key in keys]

    def decide(self, probe: Probe, batch: Batch, asked_before: int) -> Decision:
        """Candidates are predicted chunk by chunk on the probe's inputs; after each chunk only
        those missing the fewest answers stay (all that fit, when any fits), so most of the
        candidates are predicted on the first chunk alone."""
        candidates = self.candidates(probe)
        params = [self.params({**self.hyp, **candidate}) for candidate in candidates]
        alive = [i for i, p in enumerate(params) if p is not None]
        if not alive:  # the keys held stay (the hypothesis held is a valid config): the run goes on
            decision = Decision(
                probe.name,
                probe.keys,
                _plain({k: self.hyp[k] for k in probe.keys}),
                0,
                asked_before,
                about=probe.what,
                evidence={
                    "note": "no candidate forms a valid config with the other "
                    "keys held: the values held stay"
                },
            )
            self.say(f"{probe.name}: no candidate valid with the keys held; kept as held")
            return decision
        considered = len(alive)
        misses = dict.fromkeys(alive, 0)
        seen = []  # (input, answer, {candidate: prediction}) of every input asked
        asked = 0
        start, size = 0, 32
        rows = _digest(batch)
        while start < len(batch) and len(alive) > 1:
            chunk = batch.take(np.arange(start, min(start + size, len(batch))))
            predictions = dict(
                zip(alive, self._chunk_predictions([params[i] for i in alive], chunk, rows, start))
            )
            start, size = start + size, size * 2
            stacked = np.stack(list(predictions.values()))
            disagree = np.flatnonzero((stacked != stacked[0]).any(axis=0))
            if not disagree.size:
                continue
            answers = self.ask(chunk.take(disagree))
            asked += int(disagree.size)
            for i in alive:
                wrong = _differs(predictions[i][disagree], answers, self.ctx.out_format)
                misses[i] += int(np.count_nonzero(wrong))
            for row, index in enumerate(disagree):
                seen.append(
                    (
                        chunk.row(int(index)),
                        int(answers[row]),
                        {i: int(p[index]) for i, p in predictions.items()},
                    )
                )
            fewest = min(misses[i] for i in alive)
            alive = [i for i in alive if misses[i] == fewest]
        held = next(
            (
                i
                for i in (range(len(candidates)) if probe.strict else alive)
                if params[i] is not None
                and all(self.hyp.get(k) == v for k, v in candidates[i].items())
            ),
            None,
        )
        # Values that fit every answer: the first listed (the simplest). None fits (another key
        # is still wrong, or no key describes the unit): the value held stays among the best
        # (a strict probe's, whatever it misses).
        chosen = held if misses[alive[0]] and held is not None else alive[0]
        decision = Decision(
            probe.name,
            probe.keys,
            _plain(candidates[chosen]),
            considered,
            asked_before + asked,
            equivalent=[_plain(candidates[i]) for i in alive if i != chosen][:8],
            mismatches=misses[chosen],
            about=probe.what,
        )
        decision.evidence = self._evidence(seen, candidates, chosen)
        self.hyp.update(candidates[chosen])
        self.say(
            f"{probe.name}: {_values(decision.value)}"
            + (f" ({decision.mismatches} answers missed)" if decision.mismatches else "")
        )
        return decision

    def say(self, line: str) -> None:
        """One progress line (with the queries asked and the seconds so far) to the caller's sink."""
        if self.progress is not None:
            self.progress(
                f"probe [{self.unit.queries} queries, {time.perf_counter() - self.started:.1f} s] {line}"
            )

    def candidates(self, probe: Probe) -> list[dict]:
        """The probe's candidates that keep the pinned keys and read no refused scale format,
        each with group sums of a size its tree holds (:func:`_fit_groups`)."""
        return [
            _fit_groups(self.ctx, self.hyp, c)
            for c in probe.candidates(self.ctx, self.hyp)
            if all(c.get(key, value) == value for key, value in self.pinned.items())
            and c.get("inputs.scale_format", self.hyp["inputs.scale_format"]) not in self.refused
        ] or [{}]

    def misses(self, hyp: dict, batch: Batch, answers: np.ndarray) -> np.ndarray:
        """Which of ``answers`` (the unit's, to ``batch``) the hypothesis misses."""
        return _differs(self.predict(self.params(hyp), batch), answers, self.ctx.out_format)

    def polish(self, probes, decisions: dict, rounds: int = 8) -> None:
        """Each probe's keys again, against every answer of the run at once (no query): the
        candidate missing the fewest answers is taken where it misses fewer than the value held,
        until no probe's change lowers the count. Candidates are first predicted on the rows
        the hypothesis misses (few), and only those fitting some of them on the others, chunk
        by chunk while they still miss fewer than the best so far."""
        batch, answers = self.answered()
        out_format = self.ctx.out_format
        wrong = self.misses(self.hyp, batch, answers)
        for _ in range(rounds):
            changed = False
            for probe in probes:
                if not wrong.any():
                    return
                missed, held_misses = (
                    batch.take(np.flatnonzero(wrong)),
                    int(np.count_nonzero(wrong)),
                )
                right = np.flatnonzero(~wrong)
                chunks = [
                    (batch.take(rows), answers[rows])
                    for rows in np.array_split(right, max(1, -(-right.size // 1024)))
                ]
                best = None
                tried = [
                    (candidate, params)
                    for candidate in self.candidates(probe)
                    if (params := self.params({**self.hyp, **candidate})) is not None
                    and not all(self.hyp.get(k) == v for k, v in candidate.items())
                ]
                on_missed = self.predict_each([params for _, params in tried], missed)
                for (candidate, params), predicted in zip(tried, on_missed):
                    misses = int(np.count_nonzero(_differs(predicted, answers[wrong], out_format)))
                    if misses == held_misses:  # fits none of the answers the hypothesis misses
                        continue
                    limit = held_misses if best is None else best[0]
                    for rows, expected in chunks:
                        if misses >= limit:
                            break
                        misses += int(
                            np.count_nonzero(
                                _differs(self.predict(params, rows), expected, out_format)
                            )
                        )
                    if misses < limit:
                        best = (misses, candidate)
                if best is not None:
                    misses, candidate = best
                    self.hyp.update(candidate)
                    wrong = self.misses(self.hyp, batch, answers)
                    changed = True
                    decisions[probe.name] = Decision(
                        probe.name,
                        probe.keys,
                        _plain(candidate),
                        len(self.candidates(probe)),
                        decisions[probe.name].asked if probe.name in decisions else 0,
                        mismatches=misses,
                        about=probe.what,
                        evidence={
                            "note": f"taken in the last search, against all {len(batch)} answers of the run: "
                            f"misses {misses} of them, the value before {held_misses}"
                        },
                    )
            if not changed:
                return

    def _evidence(self, seen, candidates, chosen) -> dict:
        """The answered input on which the kept value fits and the most other values miss."""
        fitting = [
            (
                sum(not _same(p, answer, self.ctx.out_format) for p in predictions.values()),
                row,
                answer,
                predictions,
            )
            for row, answer, predictions in seen
            if chosen in predictions and _same(predictions[chosen], answer, self.ctx.out_format)
        ]
        if not fitting:
            return {
                "note": "no probe input told the candidates apart (every one gives the same outputs)"
                if not seen
                else "the kept value fits no answered input it was tried on"
            }
        ruled_out, row, answer, predictions = max(fitting, key=lambda item: item[0])
        others = {}
        for i, got in predictions.items():
            if (
                not _same(got, answer, self.ctx.out_format)
                and len(others) < 4
                and got not in others
            ):
                others[got] = _plain(candidates[i])
        return {
            "input": row,
            "unit_output": f"0x{answer:x}",
            "ruled_out_here": ruled_out,
            "other_values": [
                {"value": value, "output": f"0x{got:x}"} for got, value in others.items()
            ],
            "inputs_asked": len(seen),
        }


def _fit_groups(ctx: Context, hyp: dict, candidate: dict) -> dict:
    """The candidate, where it leaves group sums held whose size does not divide its tree size
    (a tree narrower than the default group of 16: units of K = 8 or 11), with the group size
    held replaced by the largest that divides both the block and the tree; unchanged where
    none does (the candidate then forms no valid config) or it sets the group size itself."""
    merged = {**hyp, **candidate}
    fused = merged["adder.fused_terms"]
    if (
        merged["inputs.scales"] != "group_sum"
        or "adder.group_terms" in candidate
        or not fused % merged["adder.group_terms"]
    ):
        return candidate
    sizes = [g for g in range(2, fused + 1) if not fused % g and not ctx.block_size % g]
    return {**candidate, "adder.group_terms": sizes[-1]} if sizes else candidate


def _values(value: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in value.items())


def _digest(batch: Batch) -> bytes:
    """A digest of the batch's rows (every field and the shape)."""
    digest = hashlib.blake2b(repr(batch.a.shape).encode(), digest_size=16)
    for name in ("a", "b", "scale_a", "scale_b", "c"):
        digest.update(np.ascontiguousarray(getattr(batch, name)).data)
    return digest.digest()


def _top_code(scale_format: str) -> int:
    """The largest code a scale format holds (E8M0: 255; UE4M3: 127)."""
    return (1 << get_format(scale_format).bits) - 1


def _unanswerable(out_format: str) -> int:
    """The prediction of a candidate that cannot read a row: a value past the output's width,
    which no answer has; a 64-bit output has none spare, so there it is one fixed finite
    pattern (a unit answering exactly that on such a row would be taken to agree)."""
    bits = get_format(out_format).bits
    return 1 << bits if bits < 64 else 0x0123456789ABCDEF


def _plain(candidate: dict) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in candidate.items()}


@functools.lru_cache(maxsize=None)
def _nan_masks(out_format: str) -> tuple[int, int]:
    """(exponent field mask, mantissa field mask) of the output format: a NaN has every
    exponent bit set and a mantissa bit set."""
    fmt = get_format(out_format)
    return ((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits, (1 << fmt.mantissa_bits) - 1


def _is_nan(bits: np.ndarray, out_format: str) -> np.ndarray:
    exponent_mask, mantissa_mask = (np.uint64(mask) for mask in _nan_masks(out_format))
    return ((bits & exponent_mask) == exponent_mask) & ((bits & mantissa_mask) != 0)


def _same(predicted: int, answer: int, out_format: str) -> bool:
    """One pair of :func:`_differs`, negated: equal bits, or both NaN. Plain integers, as the
    evidence search compares every answered input with every candidate's prediction."""
    if predicted == answer:
        return True
    exponent_mask, mantissa_mask = _nan_masks(out_format)
    return all(
        bits & exponent_mask == exponent_mask and bits & mantissa_mask
        for bits in (predicted, answer)
    )


def _differs(predicted: np.ndarray, answers: np.ndarray, out_format: str) -> np.ndarray:
    """Bits differ, unless both are NaN (NaN payloads are counted apart by the validation)."""
    return (predicted != answers) & ~(_is_nan(predicted, out_format) & _is_nan(answers, out_format))


def _validate(engine: _Engine, seed: int, random: int, corners: int) -> tuple[Validation, Batch]:
    ctx = Context(
        engine.ctx.a_format,
        engine.ctx.b_format,
        engine.ctx.k,
        engine.ctx.block_size,
        engine.ctx.out_format,
        seed=seed,
        scale_format=engine.hyp["inputs.scale_format"],
        c_format=engine.ctx.c_format,
    )
    batch = Batch.join(
        [ctx.realistic(random - random // 2), ctx.uniform(random // 2), ctx.corners(corners)]
    )
    # half the corners that cancel exactly are zero chains instead (a zero an early step leaves,
    # then -0 products), drawn after the others
    chains = np.arange(random + 15, len(batch), 16)
    batch = ctx.fit_c(batch.put(chains, ctx.zero_chains(len(chains))))
    answers = engine.ask(batch)
    predicted = engine.predict(engine.params(engine.hyp), batch)
    differs = _differs(predicted, answers, ctx.out_format)
    payload = (predicted != answers) & ~differs
    rows = np.flatnonzero(differs)
    examples = [
        {
            "input": batch.row(int(i)),
            "unit_output": f"0x{int(answers[i]):x}",
            "config_output": f"0x{int(predicted[i]):x}",
            "kind": "random" if i < random else "corner",
        }
        for i in rows[:5]
    ]
    return Validation(
        len(batch), random, corners, int(rows.size), int(np.count_nonzero(payload)), examples
    ), batch.take(rows)


#: Polishing rounds (:meth:`_Engine.polish`, each measured) at most, after every search missed.
POLISH_ROUNDS = 4

#: Rows the targeted validation asks at most, and rows it looks for per equivalent value.
TARGETED_ROWS, TARGETED_PER_VALUE = 256, 4
#: Rows of partial overflows (:meth:`Context.partial_overflow`) it draws, and asks at most.
OVERFLOW_ROWS, OVERFLOW_ASKED = 64, 16


def _targeted(
    engine: _Engine,
    decisions,
    seed: int,
    validation: Validation,
    n: int = 1024,
    overflow_rows: int = OVERFLOW_ROWS,
) -> tuple[Validation, Batch]:
    """The validation extended where a narrow output hides what separates values the probe's
    rows did not tell apart: each decision's ``equivalent`` values, put in the final hypothesis,
    are predicted (no query) on ``n`` fresh rows (realistic data and uniformly random codes,
    each also with a c that cancels the sum's leading bits so that its low bits reach the
    output); the unit is asked the rows where they disagree with the held hypothesis,
    nearest values first (those disagreeing on the fewest rows), up to
    :data:`TARGETED_PER_VALUE` rows per value and :data:`TARGETED_ROWS` in all. Likewise, apart
    from those, on ``overflow_rows`` rows where a partial sum overflows with the other sign
    than the whole (up to :data:`OVERFLOW_ASKED` asked): scales at the extremes, which random
    rows seldom meet, show where partial sums are rounded. The rows it misses are counted as
    mismatches and returned, as the validation's are."""
    hyp = engine.hyp
    ctx = Context(
        engine.ctx.a_format,
        engine.ctx.b_format,
        engine.ctx.k,
        engine.ctx.block_size,
        engine.ctx.out_format,
        seed=seed,
        scale_format=hyp["inputs.scale_format"],
        c_format=engine.ctx.c_format,
    )
    drawn = Batch.join([ctx.realistic(n // 4), ctx.uniform(n // 4)])
    batch = ctx.fit_c(Batch.join([drawn, _cancelling(ctx, drawn, hyp["inputs.scales"] != "none")]))
    cancelling_rows = len(batch)  # drawn last: the rows above stay as they were
    batch = Batch.join([batch, ctx.fit_c(ctx.partial_overflow(overflow_rows))])
    held_params = engine.params(hyp)
    held = engine.predict(held_params, batch)
    others: dict = {}  # each params once, in the order met
    for decision in decisions:
        for value in decision.equivalent:
            params = engine.params({**hyp, **value})
            if params is not None and params != held_params:
                others[params] = None
    apart = []
    for predicted in engine.predict_each(list(others), batch):
        rows = np.flatnonzero(_differs(predicted, held, ctx.out_format))
        if rows.size:
            apart.append(rows)
    chosen = _nearest_first(
        [rows[rows < cancelling_rows] for rows in apart], TARGETED_ROWS
    ) | _nearest_first([rows[rows >= cancelling_rows] for rows in apart], OVERFLOW_ASKED)
    asked = np.array(sorted(chosen), dtype=np.int64)
    if not asked.size:
        return validation, batch.take(asked)
    answers = engine.ask(batch.take(asked))
    wrong = _differs(held[asked], answers, ctx.out_format)
    missed = asked[wrong]
    examples = (
        validation.examples
        + [
            {
                "input": batch.row(int(i)),
                "unit_output": f"0x{int(a):x}",
                "config_output": f"0x{int(held[i]):x}",
                "kind": "targeted",
            }
            for i, a in zip(missed, answers[wrong])
        ][: 5 - len(validation.examples)]
    )
    return dataclasses.replace(
        validation,
        vectors=validation.vectors + int(asked.size),
        targeted=int(asked.size),
        mismatches=validation.mismatches + int(missed.size),
        examples=examples,
    ), batch.take(missed)


def _answered(engine: _Engine, validation: Validation) -> tuple[Validation, Batch]:
    """The validation extended to every input the unit has answered in the run (the probes'
    rows, earlier validations'): the keys are decided one at a time, so the hypothesis held
    at the end may miss answers an earlier decision fitted, on rows no fresh vector meets
    (a bf16 output over FP6 x FP4 products hides most of the accumulator). Those it misses are
    counted as mismatches, asking nothing more, and returned, as the validation's are."""
    batch, answers = engine.answered()
    held = engine.predict(engine.params(engine.hyp), batch)
    missed = np.flatnonzero(_differs(held, answers, engine.ctx.out_format))
    if not missed.size:
        return validation, batch.take(missed)
    examples = (
        validation.examples
        + [
            {
                "input": batch.row(int(i)),
                "unit_output": f"0x{int(answers[i]):x}",
                "config_output": f"0x{int(held[i]):x}",
                "kind": "answered",
            }
            for i in missed[:5]
        ][: 5 - len(validation.examples)]
    )
    return dataclasses.replace(
        validation,
        answered=int(missed.size),
        mismatches=validation.mismatches + int(missed.size),
        examples=examples,
    ), batch.take(missed)


def _nearest_first(apart: list[np.ndarray], limit: int) -> set[int]:
    """Up to :data:`TARGETED_PER_VALUE` rows of each value's, the values disagreeing on the
    fewest rows first, ``limit`` in all."""
    chosen: set[int] = set()
    for rows in sorted(apart, key=len):
        if len(chosen) >= limit:
            break
        wanted = TARGETED_PER_VALUE - len(chosen.intersection(rows.tolist()))
        for row in rows.tolist():
            if wanted <= 0 or len(chosen) >= limit:
                break
            if row not in chosen:
                chosen.add(row)
                wanted -= 1
    return chosen


def _cancelling(ctx: Context, batch: Batch, scaled: bool) -> Batch:
    """The rows again, each c now minus the dot's value (float64 sum of the decoded products,
    scales applied when the unit has them) rounded to 8..24 bits: the result is what lies
    below those bits, which a narrow output then shows. Rows whose sum is not finite keep c."""
    a = get_format(ctx.a_format).decode(batch.a)
    b = get_format(ctx.b_format).decode(batch.b)
    with np.errstate(all="ignore"):
        products = a * b
        if scaled:
            scale = ctx.scale.fmt.decode(batch.scale_a.astype(np.uint64)) * ctx.scale.fmt.decode(
                batch.scale_b.astype(np.uint64)
            )
            products = products * np.repeat(scale, ctx.block_size, axis=1)[:, : ctx.k]
        total = products.sum(axis=1)
        bits = ctx.rng.integers(8, 25, len(total))
        exponent = np.floor(np.log2(np.abs(total)))
        lead = np.ldexp(
            np.round(np.ldexp(total, (bits - 1 - exponent).astype(np.int64))),
            (exponent + 1 - bits).astype(np.int64),
        )
    c = batch.c.copy()
    keep = np.isfinite(lead) & (total != 0)
    c[keep] = ctx.c_bits(-lead[keep])
    return Batch(batch.a.copy(), batch.b.copy(), batch.scale_a.copy(), batch.scale_b.copy(), c)


#: Largest probe seed (a seed and the offsets added to it stay within numpy's seeding range).
MAX_SEED = 2**63 - 1


def probe(
    unit,
    a_format: str,
    b_format: str,
    k: int,
    *,
    block_size: int = 32,
    out_format: str = "fp32",
    c_format: str = "fp32",
    seed: int = 0,
    validation_vectors: int = 2048,
    corner_vectors: int = 512,
    refinements: int = 2,
    passes_limit: int = 4,
    budget: int = DEFAULT_BUDGET,
    name: str = "probed",
    seconds: float | None = None,
    progress=None,
) -> ProbeResult:
    """Characterise ``unit`` (see :mod:`mxsim.probe.units`) for A/B element formats and dot
    length ``k`` (scales per ``block_size`` elements; outputs in ``out_format``; every c the
    unit is asked is a value of ``c_format``, as fp32 bits, or fp64 bits for fp64; the emitted
    config's ``inputs.c_format``, unless a wider format is found to read c alike): decide
    every datapath key, emit the hwconfig and validate it on ``validation_vectors`` random
    vectors (half realistic data, half uniformly random codes) and ``corner_vectors`` corners
    that no decision saw (when they count no mismatch, also on up to :data:`TARGETED_ROWS`
    rows where values the probes did not tell apart disagree, :func:`_targeted`, and on every
    answer of the run, :func:`_answered`).

    At most ``budget`` dot products are asked, and none after ``seconds`` (None: no limit);
    ``progress``, a callable taking one line, hears each decision and validation as it comes.
    Whatever the unit raises, a malformed answer or a budget spent is a :class:`ProbeError`:
    before any hypothesis was measured it ends the run; after, the run stops there and returns
    the best hypothesis measured, with ``stopped`` saying why. A result that is not ``exact``
    (its validation counted mismatches) says so in its YAML. Deterministic for a seed (with
    no time budget).
    """
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(1)  # the probe's batches are small: one thread beats waking many
    try:
        return _probe(
            unit,
            a_format,
            b_format,
            k,
            block_size,
            out_format,
            c_format,
            seed,
            validation_vectors,
            corner_vectors,
            refinements,
            passes_limit,
            budget,
            name,
            seconds,
            progress,
        )
    finally:
        numba.set_num_threads(threads)


def _probe(
    unit,
    a_format,
    b_format,
    k,
    block_size,
    out_format,
    c_format,
    seed,
    validation_vectors,
    corner_vectors,
    refinements,
    passes_limit,
    budget,
    name,
    seconds,
    progress,
) -> ProbeResult:
    started = time.perf_counter()
    for fmt in (a_format, b_format, out_format, c_format):
        get_format(fmt)  # an unknown name lists the known ones
    k = check_int(k, "probe: k", 1, 4096)
    seed = check_int(seed, "probe: seed", 0, MAX_SEED)
    block_size = check_int(block_size, "probe: block_size", 1, 4096)
    for fmt, what in ((out_format, "out_format"), (c_format, "c_format")):
        if get_format(fmt).name not in SCHEMA["output"]["format"].choices:
            raise ArgumentError(
                f"probe: {what} must be one of {', '.join(SCHEMA['output']['format'].choices)}"
            )
    for fmt, operand in ((a_format, "a_format"), (b_format, "b_format")):
        if get_format(fmt).name not in SCHEMA["inputs"]["a_formats"].choices:
            raise ArgumentError(
                f"probe: {operand} {fmt!r} is not an element format a unit takes; "
                f"accepted: {', '.join(SCHEMA['inputs']['a_formats'].choices)}"
            )
    validation_vectors = check_int(validation_vectors, "probe: validation_vectors", 0, 1 << 20)
    corner_vectors = check_int(corner_vectors, "probe: corner_vectors", 0, 1 << 20)
    if validation_vectors + corner_vectors == 0:
        raise ArgumentError("probe: the validation needs at least one vector")
    counting = CountingUnit(unit, out_format, check_int(budget, "probe: budget", 1))
    ctx = Context(a_format, b_format, k, block_size, out_format, seed=seed, c_format=c_format)
    if seconds is not None and not (isinstance(seconds, (int, float)) and 0 < seconds <= 1e7):
        raise ArgumentError(f"probe: seconds must be a number in (0, 1e7], got {seconds!r}")
    engine = _Engine(counting, ctx, name, progress, seconds)
    search = _Search(
        engine, ctx, seed, validation_vectors, corner_vectors, refinements, passes_limit
    )
    search.run()
    # A refinement can make things worse when no key describes the unit: keep the best measured
    # (the first of those missing fewest, as each step keeps a later one only if it misses fewer).
    best, stopped, passes = (
        min(search.measured, key=lambda item: item[0].mismatches),
        search.stopped,
        search.passes,
    )
    validation, engine.hyp, decisions = best
    rounding_only = _rounding_only(engine, decisions.values(), seed + 3001)
    config = engine.data(engine.hyp)
    config["description"] = (
        f"probed from a black box: {ctx.a_format} x {ctx.b_format}, K = {k}, "
        f"{ctx.out_format} output; {validation.mismatches} mismatches in {validation.vectors} "
        f"validation vectors" + ("" if not validation.mismatches else "; NOT EXACT")
    )
    config = {
        key: config[key]
        for key in ("mxsim_hwconfig", "name", "description", *SCHEMA)
        if key in config
    }
    text = emit_yaml(
        config, decisions.values(), validation, counting.queries, stopped, rounding_only
    )
    parse_hwconfig(yaml.safe_load(text), "<probed config>")  # what is written loads
    engine.say(
        f"done: {validation.mismatches} mismatches in {validation.vectors} validation vectors"
    )
    batch, answers = engine.answered()

    def misses(other: dict) -> int:
        hyp = {path: held_value(other, path) for path in engine.hyp}
        if engine.params(hyp) is None:
            return len(batch)
        return int(np.count_nonzero(engine.misses(hyp, batch, answers)))

    return ProbeResult(
        config,
        text,
        list(decisions.values()),
        validation,
        counting.queries,
        time.perf_counter() - started,
        counting.seconds,
        passes,
        stopped,
        rounding_only,
        misses,
    )


class _Search:
    """The search: passes of the probes over a hypothesis, validations and refinements
    (:meth:`search`), run by the restart steps of :data:`STEPS` in turn, each only while
    every one before it missed. Every hypothesis measured is kept (``measured``); a
    :class:`ProbeError` after the first measurement ends the run with them (``stopped``)."""

    def __init__(
        self,
        engine: _Engine,
        ctx: Context,
        seed: int,
        validation_vectors: int,
        corner_vectors: int,
        refinements: int,
        passes_limit: int,
    ):
        self.engine, self.ctx, self.seed = engine, ctx, seed
        self.validation_vectors, self.corner_vectors = validation_vectors, corner_vectors
        self.refinements, self.passes_limit = refinements, passes_limit
        self.contexts = {(ctx.scale.fmt.name, False): ctx}
        self.batches: dict = {}
        self.in_output_range = (
            False  # whether the families draw inside the output's range (the last two starts)
        )
        self.asked = {p.name: 0 for p in (*PROBES, COARSE)}
        self.probes = PROBES
        self.decisions: dict[str, Decision] = {}
        self.passes = self.refined = 0
        self.late = False  # whether the late probes (Probe.late) run in this search's passes yet
        self.measured: list = []  # (validation, hypothesis, decisions) of every hypothesis measured
        self.best = None
        self.stopped = (
            None  # why the run ended before its last step (the unit failed, a budget ran out)
        )

    # -- the probes' inputs

    def inputs(self, p: Probe) -> Batch:
        """The probe's rows, drawn from its own stream (Context.draw_from: adding, removing or
        reordering probes moves no other probe's rows) once per scale format held (scale codes
        are written in it), with its settled rows after them once the late probes run."""
        engine, ctx = self.engine, self.ctx
        fmt, in_range = engine.hyp["inputs.scale_format"], self.in_output_range
        if (fmt, in_range) not in self.contexts:  # built once: a Context decodes whole formats
            self.contexts[fmt, in_range] = Context(
                ctx.a_format,
                ctx.b_format,
                ctx.k,
                ctx.block_size,
                ctx.out_format,
                seed=self.seed,
                scale_format=fmt,
                c_format=ctx.c_format,
            )
        drawn = self.contexts[fmt, in_range]
        if (p.name, fmt, in_range) not in self.batches:
            drawn.window = engine.hyp["adder.align_fraction_bits"]
            drawn.in_output_range = in_range
            self.batches[p.name, fmt, in_range] = p.inputs(drawn.draw_from(p.name))
        batch = self.batches[p.name, fmt, in_range]
        if self.late and p.settled is not None:
            if (p.name, fmt, in_range, "settled") not in self.batches:
                self.batches[p.name, fmt, in_range, "settled"] = Batch.join(
                    [batch, p.settled(drawn.draw_from(p.name, "settled"))]
                )
            batch = self.batches[p.name, fmt, in_range, "settled"]
        return batch

    # -- passes, validations, refinements

    def run_pass(self, extra: Batch | None) -> bool:
        """One decision per probe; whether any kept value changed."""
        self.passes += 1
        before = dict(self.engine.hyp)
        for p in self.probes:
            if p.late and not self.late:
                continue
            batch = self.inputs(p) if extra is None else Batch.join([extra, self.inputs(p)])
            self.decisions[p.name] = self.engine.decide(p, batch, self.asked[p.name])
            self.asked[p.name] = self.decisions[p.name].asked
        return self.engine.hyp != before

    def search(self, rounds: int | None = None) -> None:
        """Passes, then validations and at most ``rounds`` refinements (default
        ``refinements``); ``best`` becomes the best (validation, hypothesis, decisions) measured."""
        rounds = self.refinements if rounds is None else rounds
        extra, limit, self.refined, self.late = None, self.passes_limit, 0, False
        while True:
            for _ in range(limit):  # passes until no decision changes
                if not self.run_pass(extra):
                    break
            if (
                not self.late
            ):  # the late probes join a hypothesis the others have settled; passes again
                self.late = True
                for _ in range(limit):
                    if not self.run_pass(extra):
                        break
            validation, missed = self.measure(self.decisions, self.refined)
            self.keep(validation, self.decisions)
            if not validation.mismatches or self.refined == rounds:
                return
            self.refined += 1
            extra = missed if extra is None else Batch.join([extra, missed])
            limit = 2

    def keep(self, validation: Validation, decisions: dict) -> None:
        """Record the hypothesis held as measured; the best if it misses fewer than the best so far."""
        item = (validation, dict(self.engine.hyp), dict(decisions))
        self.measured.append(item)
        if self.best is None or validation.mismatches < self.best[0].mismatches:
            self.best = item

    def measure(self, held_decisions: dict, index: int) -> tuple[Validation, Batch]:
        """The validation of the hypothesis held, then where the output may hide what the
        probes' rows did not show, then on every answer the run has: the first that misses."""
        engine = self.engine
        validation, missed = _validate(
            engine, self.seed + 1 + index, self.validation_vectors, self.corner_vectors
        )
        if not validation.mismatches:
            validation, missed = _targeted(
                engine, held_decisions.values(), self.seed + 1001 + index, validation
            )
        if not validation.mismatches:
            validation, missed = _answered(engine, validation)
        engine.say(
            f"validation: {validation.mismatches} mismatches in {validation.vectors} vectors"
        )
        return validation, missed

    def restart(self, probes=PROBES, hyp: dict | None = None) -> None:
        """A fresh search's state: the hypothesis (default: the start), the probes, no decisions."""
        self.engine.hyp = dict(self.engine.start if hyp is None else hyp)
        self.probes = probes
        self.decisions.clear()

    # -- the steps

    def run(self) -> None:
        """The steps of :data:`STEPS` in turn; a :class:`ProbeError` after the first
        measurement stops the run there (``stopped``), one before it ends the run."""
        try:
            for name, step in STEPS:
                if self.best is not None and not self.best[0].mismatches:
                    break
                if self.best is not None:
                    self.engine.say(f"step: {name}")
                step(self)
        except ProbeError as error:
            if not self.measured:  # no hypothesis measured: nothing to keep
                raise
            self.stopped = str(error)
            self.engine.say(f"stopped: {self.stopped}; keeping the best hypothesis measured")

    def first(self) -> None:
        self.search()

    def other_placement(self) -> None:
        """E8M0 scales on the products and on exact group sums describe nearly the same unit,
        their windows anchored a bit or two apart, and the key-by-key search holds to the one it
        met first: while the validation counts mismatches, search again with the other pinned."""
        engine = self.engine
        for placement in ("products", "group_sum"):
            held = self.best[1]
            if (
                not self.best[0].mismatches
                or held["inputs.scales"] not in ("products", "group_sum")
                or held["inputs.scales"] == placement
            ):
                continue
            engine.pinned = {
                "inputs.scales": placement,
                "inputs.scale_format": held["inputs.scale_format"],
            }
            if engine.params({**engine.start, **engine.pinned}) is None:
                engine.hyp = {**engine.start, **engine.pinned}
                continue
            self.restart(self.probes, {**engine.start, **engine.pinned})
            self.search()
        engine.pinned = {}

    def coarse(self) -> None:
        """Again from the start, tree size, window and rounding decided together first."""
        self.restart(_with_before_trees(COARSE))
        self.search()

    def coarse_overflow(self) -> None:
        """Once more with the overflow rules, where the products pass fp32's range."""
        if products_pass_fp32(self.ctx):
            self.restart(_with_before_trees(COARSE_OVERFLOW))
            self.search()

    def output_range(self) -> None:
        """Where the products pass the output's range, the first two starts again on rows drawn
        inside it (Context.output_span): above it most of the families' results are ±Inf. They
        refine twice as often: on rows inside the output's range a validation misses few rows,
        and each refinement's rows move a key or two (mi300 E4M3FNUZ x tf32 -> fp16: 12, 66, 1,
        2, then 0 mismatches)."""
        for probes in (PROBES, _with_before_trees(COARSE)):
            if not self.best[0].mismatches or self.ctx.output_span() == self.ctx.full_span():
                break
            self.restart(probes)
            self.in_output_range = True
            self.search(2 * self.refinements)

    def polish(self) -> None:
        """Each probe's keys again against every answer of the run at once, from the hypothesis
        measured so far that misses the fewest of them (not polished before), then measured
        afresh: its validation's answers join the run's for the next round."""
        engine = self.engine
        polished_from: list = []
        for attempt in range(POLISH_ROUNDS):
            if not self.best[0].mismatches:
                break
            batch, answers = engine.answered()
            starts = [item for item in self.measured if item[1] not in polished_from]
            if not starts:
                break
            start = min(
                starts,
                key=lambda item: int(np.count_nonzero(engine.misses(item[1], batch, answers))),
            )
            polished_from.append(start[1])
            engine.hyp, polished = dict(start[1]), dict(start[2])
            engine.polish((*PROBES, COARSE), polished)
            if engine.hyp == start[1]:  # no key moved: nothing new to measure
                continue
            validation, _ = self.measure(polished, 2001 + attempt)
            self.keep(validation, polished)


#: The search's steps, in order: each runs only while every hypothesis measured before it
#: misses (docs/probe.md, "How keys are decided").
STEPS = (
    ("first search", _Search.first),
    ("the other scale placement", _Search.other_placement),
    ("coarse start", _Search.coarse),
    ("coarse start with the overflow rules", _Search.coarse_overflow),
    ("inside the output's range", _Search.output_range),
    ("polishing", _Search.polish),
)


def _with_before_trees(start: Probe) -> tuple[Probe, ...]:
    """The probes with a coarse start put before the trees probe."""
    trees = next(i for i, p in enumerate(PROBES) if p.name == "trees")
    return (*PROBES[:trees], start, *PROBES[trees:])


class _FlowList(list):
    pass


class _Dumper(yaml.SafeDumper):
    """Lists (formats, term orders) on one line."""


_Dumper.add_representer(
    _FlowList,
    lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True),
)


def emit_yaml(
    config: dict,
    decisions,
    validation: Validation,
    queries: int,
    stopped: str | None = None,
    rounding_only=(),
) -> str:
    """The hwconfig YAML, with a header comment written from the config itself and its
    evidence: each probe's keys with the values the config holds (as JSON), the validation,
    whether the config is exact, why the run stopped early, and the keys decided only under
    the rounding probed (:func:`_rounding_only`)."""
    shaped = {
        section: (
            {
                key: (_FlowList(value) if isinstance(value, list) else value)
                for key, value in body.items()
            }
            if isinstance(body, dict)
            else body
        )
        for section, body in config.items()
    }
    header = [f"# Probed hwconfig: {queries} dot products asked of the unit."]
    if validation.mismatches:
        header.append(
            f"# NOT EXACT: this config misses {validation.mismatches} of the unit's answers it was checked on."
        )
    if stopped:
        header.append(f"# The run stopped early: {stopped}.")
    header.append(
        f"# Validation: {validation.mismatches} mismatches in {validation.vectors} vectors "
        f"({validation.random} random: half realistic, half uniform codes; {validation.corners} corners; "
        f"{validation.targeted} targeted)"
        + (
            f", {validation.answered} of the run's earlier answers missed"
            if validation.answered
            else ""
        )
        + (
            f", {validation.nan_payload_differences} NaN outputs with another payload"
            if validation.nan_payload_differences
            else ""
        )
        + "."
    )
    for decision in decisions:
        values = ", ".join(
            f"{path}={json.dumps(held_value(config, path))}" for path in decision.keys
        )
        header.append(f"#   {decision.probe}: {values} ({decision.asked} inputs asked)")
    for entry in rounding_only:
        header.append(
            f"# Decided under {entry['rounding']} only: {entry['key']}={json.dumps(entry['held'])}; "
            f"{', '.join(json.dumps(v) for v in entry['others'])} alike under it, "
            f"not under {', '.join(entry['differs_under'])}."
        )
    return (
        "\n".join(header)
        + "\n"
        + yaml.dump(shaped, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
    )


def held_value(config: dict, path: str):
    """The value a config mapping holds at a key path (its schema default where unset)."""
    section, key = path.split(".")
    return config.get(section, {}).get(key, SCHEMA[section][key].default)


#: The keys that carry a unit's rounding mode (a unit taking a mode per operation sets these).
ROUNDING_KEYS = ("accumulator.rounding", "output.rounding")


def _rounding_only(engine: _Engine, decisions, seed: int, n: int = 512) -> list[dict]:
    """The keys decided only under the rounding held: each decision's equivalent values (those
    no answer told apart), put in the final hypothesis, are predicted beside it (no query) on
    ``n`` fresh rows (realistic data, uniformly random codes, each also with c cancelling its
    leading bits); those alike under the rounding held are predicted again under every other
    rounding mode (set on :data:`ROUNDING_KEYS`). A key whose value there differs under some
    mode is listed once, with the other values and the modes: a unit taking its rounding mode
    per operation, derived from this config by changing the mode alone, is only right where
    none is listed (an E4M3 grid of 33 or 34 fraction bits: alike to nearest, not toward zero)."""
    hyp, ctx = engine.hyp, engine.ctx
    held_mode = hyp["accumulator.rounding"]
    drawn_ctx = Context(
        ctx.a_format,
        ctx.b_format,
        ctx.k,
        ctx.block_size,
        ctx.out_format,
        seed=seed,
        scale_format=hyp["inputs.scale_format"],
        c_format=ctx.c_format,
    )
    drawn = Batch.join([drawn_ctx.realistic(n // 4), drawn_ctx.uniform(n // 4)])
    batch = drawn_ctx.fit_c(
        Batch.join([drawn, _cancelling(drawn_ctx, drawn, hyp["inputs.scales"] != "none")])
    )
    held = {held_mode: engine.predict(engine.params(hyp), batch)}
    found: dict = {}
    tried = set()
    for decision in decisions:
        for value in decision.equivalent:
            other = {**hyp, **value}
            changed = [
                path for path in value if hyp.get(path) != value[path] and path not in ROUNDING_KEYS
            ]
            params = engine.params(other)
            if not changed or params is None or params in tried:
                continue
            tried.add(params)
            if _differs(engine.predict(params, batch), held[held_mode], ctx.out_format).any():
                continue  # not alike under the rounding held on these rows: the validation's to judge
            modes = []
            for mode in DIRECTED_AND_NEAREST:
                moved = dict.fromkeys(ROUNDING_KEYS, mode)
                first, second = engine.params({**hyp, **moved}), engine.params({**other, **moved})
                if mode == held_mode or first is None or second is None:
                    continue
                if mode not in held:
                    held[mode] = engine.predict(first, batch)
                if _differs(held[mode], engine.predict(second, batch), ctx.out_format).any():
                    modes.append(mode)
            for path in changed if modes else ():
                entry = found.setdefault(
                    path,
                    {
                        "key": path,
                        "held": _plain({path: hyp[path]})[path],
                        "others": [],
                        "rounding": held_mode,
                        "differs_under": [],
                    },
                )
                entry["others"] += [
                    v for v in [_plain({path: value[path]})[path]] if v not in entry["others"]
                ]
                entry["differs_under"] = [
                    m for m in DIRECTED_AND_NEAREST if m in entry["differs_under"] or m in modes
                ]
    return list(found.values())
