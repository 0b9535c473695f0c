"""The sans-IO part of task pass-through: what the gateway declares, what a task-augmented call keeps
on its way upstream, how a task's id is replaced on the way back, and how its answer is classified."""

from __future__ import annotations

from drawbridge.gateway.pipeline.outcomes import Outcome, outcome_of_response
from drawbridge.gateway.protocol.hop import outbound_params, union_capabilities
from drawbridge.gateway.protocol.tasks import (
    RELATED_TASK,
    created_result,
    created_task,
    related_renamed,
    related_task_id,
    renamed_task,
    task_capability,
    task_only,
)

RUNS_TASKS = {"tools": {}, "tasks": {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}}
SAMPLES_AS_TASKS = {"tools": {}, "tasks": {"list": {}, "requests": {"sampling": {"createMessage": {}}}}}
TASK = {"taskId": "up-1", "status": "working", "createdAt": "2026-01-01T00:00:00Z", "lastUpdatedAt": "2026-01-01T00:00:00Z", "ttl": 1000}


def test_tasks_are_declared_only_for_tool_calls_an_upstream_runs_as_tasks_and_only_when_asked() -> None:
    assert union_capabilities([RUNS_TASKS], tasks=True)["tasks"] == RUNS_TASKS["tasks"]
    assert "tasks" not in union_capabilities([RUNS_TASKS])  # a 2026-07-28 discover, an older session
    assert "tasks" not in union_capabilities([SAMPLES_AS_TASKS, {"tools": {}}], tasks=True)
    no_cancel = {"tasks": {"requests": {"tools": {"call": {}}}}}
    assert task_capability([no_cancel]) == {"list": {}, "requests": {"tools": {"call": {}}}}


def test_a_tool_runs_only_as_a_task_when_its_execution_requires_one() -> None:
    assert task_only({"name": "t", "execution": {"taskSupport": "required"}})
    for execution in ({"taskSupport": "optional"}, {"taskSupport": "forbidden"}, {}, None, "required"):
        assert not task_only({"name": "t", "execution": execution})
    assert not task_only({"name": "t"})


def test_a_call_keeps_its_task_only_when_it_goes_to_a_task_runner() -> None:
    params = {"name": "srv.brew", "arguments": {}, "task": {"ttl": 60000}}
    assert outbound_params(params, name="brew", task=True) == {"name": "brew", "arguments": {}, "task": {"ttl": 60000}}
    assert outbound_params(params, name="brew") == {"name": "brew", "arguments": {}}


def test_the_task_id_is_replaced_wherever_it_names_the_task() -> None:
    result = {"task": TASK, "_meta": {"x": 1}}
    assert created_task(result) == TASK
    assert created_result(result, "gw-1") == {"task": {**TASK, "taskId": "gw-1"}, "_meta": {"x": 1}}
    assert renamed_task(TASK, "gw-1")["taskId"] == "gw-1" and TASK["taskId"] == "up-1"
    payload = {"content": [], "_meta": {RELATED_TASK: {"taskId": "up-1"}, "other": True}}
    assert related_renamed(payload, "gw-1")["_meta"] == {RELATED_TASK: {"taskId": "gw-1"}, "other": True}
    assert related_renamed({"content": []}, "gw-1") == {"content": []}
    assert related_task_id(payload) == "up-1" and related_task_id({"_meta": {RELATED_TASK: {"taskId": 3}}}) is None
    assert created_task({"content": [], "task": TASK}) is None  # a CallToolResult is never a task
    assert created_task({"task": {"taskId": 7}}) is None


def test_a_created_task_is_its_own_outcome() -> None:
    assert outcome_of_response({"result": {"task": TASK}}) == (Outcome.TASK_CREATED, None, None)
    assert outcome_of_response({"result": {"content": []}}) == (Outcome.OK, None, None)
