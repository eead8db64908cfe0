"""The reward client's old homes in ppo_client still work for one release, and warn.

Each old path gives the very object of its new home in :mod:`reward_client` and raises a
DeprecationWarning naming that home. A shim module warns when it is imported, so each test
imports it afresh (its ``sys.modules`` entry removed for the test).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from types import ModuleType

import pytest

import ppo_client
import reward_client
import reward_client.integrations.trl
import reward_client.integrations.verl
import reward_client.targets
import reward_client.wire


def import_afresh(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """Import ``name`` as if for the first time (the old module is back after the test)."""
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


@pytest.mark.parametrize(
    "name",
    ["RewardClient", "AsyncRewardClient", "RewardClientError", "RewardServerError", "ScoreResult"],
)
def test_client_names_on_ppo_client(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(vars(ppo_client), name, raising=False)
    with pytest.warns(DeprecationWarning, match=rf"reward_client\.{name}") as caught:
        value = getattr(ppo_client, name)
    assert value is getattr(reward_client, name)
    assert len(caught) == 1
    assert caught[0].filename == __file__  # it points at the caller, not at ppo_client


def test_from_ppo_client_import_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(vars(ppo_client), "RewardClient", raising=False)
    with pytest.warns(DeprecationWarning, match=r"from reward_client import RewardClient") as w:
        from ppo_client import RewardClient
    assert RewardClient is reward_client.RewardClient
    assert len(w) == 1


def test_trainer_names_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert ppo_client.PPOConfig.__module__ == "ppo_client.config"
    assert "RewardClient" not in ppo_client.__all__


def test_ppo_client_client(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(DeprecationWarning, match=r"ppo_client\.client .*reward_client"):
        old = import_afresh("ppo_client.client", monkeypatch)
    for name in old.__all__:
        assert getattr(old, name) is getattr(reward_client, name), name
    assert old.RewardClient is reward_client.RewardClient
    assert old.RetryPolicy is reward_client.RetryPolicy


def test_ppo_client_trl(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(DeprecationWarning, match=r"reward_client\.integrations\.trl"):
        old = import_afresh("ppo_client.trl", monkeypatch)
    assert old.RemoteReward is reward_client.integrations.trl.RemoteReward
    assert old.RewardComponent is reward_client.integrations.trl.RewardComponent


def test_ppo_client_verl_as_verl_loads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's ``pkg://ppo_client.verl`` imports the module and looks the function up by name."""
    match = r"pkg://reward_client\.integrations\.verl"
    with pytest.warns(DeprecationWarning, match=match):
        old = import_afresh("ppo_client.verl", monkeypatch)
    new = reward_client.integrations.verl
    for name in new.__all__:
        assert getattr(old, name) is getattr(new, name), name
    assert sorted(old.__all__) == sorted(new.__all__)


def test_ppo_client_protocols(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(DeprecationWarning, match=r"reward_client\.wire"):
        old = import_afresh("ppo_client.protocols", monkeypatch)
    for name in reward_client.wire.__all__:
        assert getattr(old, name) is getattr(reward_client.wire, name), name
    assert old.Parsed is reward_client.ScoreResult
    (request,) = old.requests("remote-reward", {"texts": ["a"]}, 8, None)
    assert request.path == "/score" and request.body == {"texts": ["a"]}


def test_ppo_client_endpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(DeprecationWarning, match=r"reward_client\.targets"):
        old = import_afresh("ppo_client.endpoints", monkeypatch)
    for name in old.__all__:
        assert getattr(old, name) is getattr(reward_client.targets, name), name
