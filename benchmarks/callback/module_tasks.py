"""Ansible callback: how many tasks ran a module on each host, per role (benchmarks/converge_tasks.py).

A task that runs its module costs the node ~0.26 CPU-s (AnsiballZ payload, module_utils imports; BENCHMARKS.md,
"Where `.ci/run`'s time goes") whether it reports ok or changed; a skipped task or item costs next to nothing, and
so do the actions that run on the controller alone (debug, assert, set_fact, meta, includes). Each loop item that
runs is one module run. Appends one JSON line per playbook run to $FMCLUSTER_MODULE_TASKS_OUT:
{"hosts": {host: {role: [module runs, skipped]}}}.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Any

from ansible.plugins.callback import CallbackBase

CONTROLLER_ONLY = {"debug", "assert", "set_fact", "fail", "meta", "include_role", "include_tasks", "import_role",
                   "import_tasks", "include_vars", "add_host", "group_by", "set_stats", "pause", "end_play",
                   "validate_argument_spec"}


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "module_tasks"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))

    def _count(self, result: Any, ran: bool) -> None:
        task = result._task
        action = task.action.rsplit(".", 1)[-1]
        if action in CONTROLLER_ONLY:
            return
        role = task._role.get_name() if task._role else "(play)"
        self.counts[result._host.get_name()][role][0 if ran else 1] += 1

    def _whole(self, result: Any, ran: bool) -> None:
        if "results" not in result._result:  # a loop's items are counted one by one
            self._count(result, ran)

    def v2_runner_on_ok(self, result: Any) -> None:
        self._whole(result, True)

    def v2_runner_on_failed(self, result: Any, ignore_errors: bool = False) -> None:
        self._whole(result, True)

    def v2_runner_on_skipped(self, result: Any) -> None:
        self._whole(result, False)

    def v2_runner_item_on_ok(self, result: Any) -> None:
        self._count(result, True)

    def v2_runner_item_on_failed(self, result: Any) -> None:
        self._count(result, True)

    def v2_runner_item_on_skipped(self, result: Any) -> None:
        self._count(result, False)

    def v2_playbook_on_stats(self, stats: Any) -> None:
        out = os.environ.get("FMCLUSTER_MODULE_TASKS_OUT")
        if out:
            with open(out, "a") as f:
                f.write(json.dumps({"hosts": self.counts}) + "\n")
