"""The one restart policy (``infra.common.supervisor``) and the handles that use it without a Ray cluster:
the budget, the recovery hook, the per-attempt timeout, the events, and their one-line errors."""

import concurrent.futures
from types import SimpleNamespace

import pytest

from infra.common.supervisor import AttemptTimedOut, RestartsExhausted, Supervisor, SupervisorEvent
from infra.service.actor import HandleState


class Died(RuntimeError):
    """A death a restart mends (as Ray's ``RayActorError`` is for an actor)."""


def _recording() -> tuple[list, Supervisor]:
    events: list[SupervisorEvent] = []
    return events, Supervisor("the widget", 2, "widget.max_restarts", timeout_s=0.05,
                              timeout_setting="widget.timeout_s", on_event=lambda e, _: events.append(e))


def test_the_hook_runs_once_per_restart_and_its_result_is_returned() -> None:
    events, supervisor = _recording()
    calls = []
    assert supervisor.restart(Died("first"), lambda: calls.append(1) or "new actor") == "new actor"
    assert supervisor.restart("second", lambda: calls.append(2)) is None
    assert calls == [1, 2] and supervisor.restarts == 2
    assert events == [SupervisorEvent.DIED, SupervisorEvent.RESTARTING, SupervisorEvent.RESTARTED] * 2


def test_a_spent_budget_is_one_line_naming_the_setting_and_chaining_the_cause() -> None:
    events, supervisor = _recording()
    hook = []
    for _ in range(2):
        supervisor.restart("crash", lambda: hook.append(1))
    cause = Died("out of memory\n  Traceback (most recent call last): ...")
    with pytest.raises(RestartsExhausted) as info:
        supervisor.restart(cause, lambda: hook.append(1))
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("the widget died 3 times, more than widget.max_restarts=2 allows; raise widget.max_restarts")
    assert message.endswith("(last: out of memory)")
    assert info.value.__cause__ is cause
    assert len(hook) == 2 and supervisor.restarts == 2, "the hook ran although the budget was spent"
    assert events[-2:] == [SupervisorEvent.DIED, SupervisorEvent.GAVE_UP]


def test_zero_restarts_gives_up_at_the_first_death_with_the_callers_error() -> None:
    class JobError(RuntimeError):
        pass

    supervisor = Supervisor("the trainer actor", 0, "fleet.max_restarts", error=JobError)
    with pytest.raises(JobError, match=r"died 1 times, more than fleet.max_restarts=0"):
        supervisor.restart("gone", lambda: pytest.fail("no restart is allowed"))


def test_no_limit_keeps_restarting() -> None:
    supervisor = Supervisor("the gang's actors", None, "GangBackend(restart=)")
    for _ in range(50):
        supervisor.restart("placed again", lambda: None)
    assert supervisor.restarts == 50


def test_an_attempt_past_its_timeout_is_one_line_naming_the_timeout_setting_and_is_not_restarted() -> None:
    events, supervisor = _recording()
    never = concurrent.futures.Future()  # never resolved: result(timeout) raises TimeoutError for real
    with pytest.raises(AttemptTimedOut) as info:
        supervisor.run(never.result, retry_on=(Died,), recover=lambda exc: pytest.fail("a hang is not restarted"))
    assert isinstance(info.value, TimeoutError)
    message = str(info.value)
    assert "\n" not in message and "did not finish within widget.timeout_s=0.05 s; raise widget.timeout_s" in message
    assert events == [SupervisorEvent.TIMED_OUT] and supervisor.restarts == 0


def test_an_attempt_gets_the_timeout_and_none_without_one() -> None:
    assert Supervisor("x", 1, "s", timeout_s=7.5).attempt(lambda timeout_s: timeout_s) == 7.5
    assert Supervisor("x", 1, "s").attempt(lambda timeout_s: timeout_s) is None


def test_run_retries_deaths_with_the_hook_and_passes_other_errors_through() -> None:
    _, supervisor = _recording()
    outcomes = iter([Died("a"), Died("b"), "done"])
    recovered = []

    def attempt(_timeout_s):
        outcome = next(outcomes)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    assert supervisor.run(attempt, (Died,), lambda exc: recovered.append(str(exc))) == "done"
    assert recovered == ["a", "b"] and supervisor.restarts == 2
    def bug(_timeout_s):
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        supervisor.run(bug, (Died,), lambda exc: None)
    assert supervisor.restarts == 2, "an error a restart cannot mend was counted"


@pytest.mark.parametrize("kwargs, message", [
    ({"max_restarts": -1}, "widget.max_restarts=-1"),
    ({"max_restarts": 1, "timeout_s": 0}, "widget.timeout_s=0"),
])
def test_invalid_settings_name_themselves(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        Supervisor("the widget", setting="widget.max_restarts", timeout_setting="widget.timeout_s", **kwargs)


def test_resilient_service_restarts_each_dead_actor_once_within_its_budget(monkeypatch) -> None:
    import ray

    from infra.llm.service_plane import ResilientService

    killed = []
    monkeypatch.setattr(ray, "kill", killed.append)  # a real ray.kill would start a local Ray for a plain object
    started = []
    service = ResilientService(lambda: started.append(object()) or started[-1], max_restarts=1, name="reward")
    first = service.actor
    service.restart(first)
    service.restart(first)  # a second caller that saw the same death: already replaced, not counted
    assert service.restarts == 1 and len(started) == 2 and service.actor is started[1] and killed == [started[0]]
    with pytest.raises(RestartsExhausted, match=r"^the reward actor died 2 times, more than "
                                                r"ResilientService\(max_restarts=\)=1 allows"):
        service.restart(service.actor)
    assert not ray.is_initialized()


def test_gang_backend_counts_a_new_placement_as_a_restart_and_growth_as_none() -> None:
    from infra.service.client import GangBackend

    def status(epoch: int, bundles: tuple[int, ...]) -> SimpleNamespace:
        return SimpleNamespace(state=HandleState.PLACED, placement=SimpleNamespace(epoch=epoch),
                               groups={b: f"pg{epoch}-{b}" for b in bundles}, reason="placed")

    gang = SimpleNamespace(name="job", status=status(1, (0,)), on_change=lambda callback: None)
    told = []
    backend = GangBackend(gang, on_restart=told.append)
    launched = []
    backend._launch = lambda bundle, st: launched.append((bundle, st.placement.epoch))  # Ray-free
    backend._specs = {0: "spec", 1: "spec"}
    backend._actors = {0: "actor"}
    backend._changed(status(1, (0, 1)))  # grown by bundle 1: its actor starts, nothing restarts
    assert launched == [(1, 1)] and backend.supervisor.restarts == 0 and told == [backend]
    backend._actors = {0: "actor", 1: "actor"}
    backend._changed(status(2, (0, 1)))  # placed again: both restart on the new groups
    assert launched[1:] == [(0, 2), (1, 2)] and backend.supervisor.restarts == 1 and told == [backend] * 2
