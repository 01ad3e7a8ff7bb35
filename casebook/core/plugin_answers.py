"""The case plug-in's answers to the config check (``config.load_case``), kept by the
hash of the kernel sources the case imports (``provenance.kernel_sources_sha256``, what
makes its records stale). While the sources are unchanged, a process that loads a case
config (Snakemake's, on every rerun; each job's) imports no kernel package, and no jax."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from casebook.core import cases, files, paths, provenance


class PluginAnswers:
    """``outputs``, ``baseline_outputs``, ``ablates`` and ``params_problem`` of a case's
    plug-in, as the plug-in answers them; the plug-in is imported at the first question
    not yet kept. An error (a name the case does not have) is raised each time, never
    kept."""

    def __init__(self, case: str):
        self.case = case
        self.file = Path(paths.plugin_answers(case))
        self.sources_sha256 = provenance.kernel_sources_sha256(case)
        self.kept = self._read()
        self.added = False

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.file.read_text())
        except (OSError, ValueError):  # none yet, or unreadable: asked again
            return {}
        if not isinstance(data, dict) or data.get("sources_sha256") != self.sources_sha256:
            return {}
        answers = data.get("answers")
        return answers if isinstance(answers, dict) else {}

    def _ask(self, question: str, argument: Any) -> Any:
        key = f"{question} {json.dumps(argument, sort_keys=True)}"
        if key not in self.kept:
            plugin = cases.load(self.case)
            answer = (cases.params_problem(plugin, argument) if question == "params_problem"
                      else getattr(plugin, question)(argument))
            self.kept[key] = (answer if answer is None or isinstance(answer, str)
                              else list(answer))
            self.added = True
        return self.kept[key]

    def outputs(self, variant: str) -> tuple[str, ...]:
        return tuple(self._ask("outputs", variant))

    def baseline_outputs(self, name: str) -> tuple[str, ...]:
        return tuple(self._ask("baseline_outputs", name))

    def ablates(self, name: str) -> str:
        """The variant ablation ``name`` switches a part of off; ValueError where the
        plug-in has no such ablation (or no ablations)."""
        if f"ablates {json.dumps(name)}" not in self.kept \
                and not hasattr(cases.load(self.case), "ablates"):
            raise ValueError(f"the {self.case} plug-in has no ablations (no `ablates` hook)")
        return self._ask("ablates", name)

    def params_problem(self, params: dict[str, Any]) -> tuple[str, str] | None:
        found = self._ask("params_problem", params)
        return None if found is None else tuple(found)

    def save(self) -> None:
        """Keep what was newly answered (written whole, then renamed); where the build
        tree cannot hold it, nothing is kept and the plug-in is asked again next time."""
        if not self.added:
            return
        with contextlib.suppress(OSError):
            files.atomic_write_text(self.file, json.dumps(
                {"case": self.case, "sources_sha256": self.sources_sha256,
                 "answers": self.kept}, indent=1, sort_keys=True))
            self.added = False
