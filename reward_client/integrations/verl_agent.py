"""verl's tool agent loop, recording the agent's trajectory for the reward function.

verl (checked against 0.9.1) runs a multi-turn rollout in its ``ToolAgentLoop``: the
policy's turns are parsed into assistant messages with ``tool_calls``, the tools' results
become ``tool`` messages, and the prompt grows turn by turn. The reward function sees none of
those messages: ``solution_str`` is the response tokens decoded as one text, tool results
included, with no mark of where a call or a result starts. The reward loop's managers
``naive``, ``limited`` and ``remote`` do merge the agent loop's ``extra_fields`` into the
``extra_info`` they hand the reward function (``dapo`` does not; nor does verl's legacy
reward path, used when the reward loop is off).

:class:`TrajectoryToolAgentLoop` is verl's ``ToolAgentLoop`` that also records, after each of
the policy's turns, ``extra_fields["reward_trajectory"]`` =
``{"messages": [...], "tools": [...]}``: the prompt's messages, every turn so far with its
tool calls and results, and the tools the prompt offered (OpenAI function specs), exactly
what the policy was shown. :mod:`reward_client.integrations.verl` scores that trajectory as
one conversation when ``extra_info`` holds it. A tool result added after the policy's last
turn (the response was full) is not in it, since the policy never saw it; a last turn that
ended the rollout before verl parsed it (the length or turn limit) is added as plain text.
Assistant contents are as verl's tool parser left them, less the tokenizer's special tokens
(the end-of-turn token the parser keeps) and the white space around them.

Use it in place of verl's loop with an agent-loop config file (rows whose ``agent_name`` is
``tool_agent`` then run it)::

    # agent_loops.yaml, given as actor_rollout_ref.rollout.agent.agent_loop_config_path
    - name: tool_agent
      _target_: reward_client.integrations.verl_agent.TrajectoryToolAgentLoop

verl then keeps the trajectory as a column of the batch (``reward_trajectory``), as it keeps
every extra field. Its workers' chunks of a batch must have the same columns, so run every
row of a batch through this loop (the file above gives it verl's own name for tool rows),
not some rows through verl's ``single_turn_agent``.

The class is made on first use (verl's worker looks it up by name), so that importing this
module needs no verl: the rest of the reward client never imports it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TRAJECTORY_KEY"]  # and TrajectoryToolAgentLoop, made on first use (with verl)

#: The ``extra_fields`` (and so ``extra_info``) key of the recorded trajectory.
TRAJECTORY_KEY = "reward_trajectory"


def __getattr__(name: str) -> Any:
    """``TrajectoryToolAgentLoop``, made (importing verl) the first time it is asked for."""
    if name != "TrajectoryToolAgentLoop":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = _trajectory_loop()
    globals()[name] = cls
    return cls


def _trajectory_loop() -> type:
    """verl's ``ToolAgentLoop`` subclassed to record the trajectory (module docstring)."""
    try:
        from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
        from verl.experimental.agent_loop.tool_agent_loop import (
            AgentData,
            AgentState,
            ToolAgentLoop,
        )
    except ImportError as exc:  # only where verl runs the agent loop: not in this project's images
        raise ModuleNotFoundError(
            f"TrajectoryToolAgentLoop subclasses verl's ToolAgentLoop: install verl ({exc})"
        ) from exc

    class TrajectoryToolAgentLoop(ToolAgentLoop):  # type: ignore[misc, valid-type]
        """verl's ``ToolAgentLoop``, recording the trajectory in its output's
        ``extra_fields`` (:mod:`reward_client.integrations.verl_agent`). verl's worker makes
        one instance per rollout."""

        _reward_trajectory: dict[str, Any] | None = None
        _reward_prompt = 0

        async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
            self._reward_trajectory = None
            output = await super().run(sampling_params, **kwargs)
            if self._reward_trajectory is not None:
                output.extra_fields[TRAJECTORY_KEY] = self._reward_trajectory
            return output

        async def _handle_generating_state(
            self,
            agent_data: AgentData,
            sampling_params: dict[str, Any],
            ignore_termination: bool = False,
        ) -> AgentState:
            before = len(agent_data.messages)
            if self._reward_trajectory is None:  # the first turn: the prompt's messages
                self._reward_prompt = before
            state = await super()._handle_generating_state(
                agent_data, sampling_params, ignore_termination
            )
            messages = list(agent_data.messages)
            if len(messages) == before:  # the rollout ended before verl parsed this turn
                ids = agent_data.response_ids
                text = await self.loop.run_in_executor(
                    None, lambda: self.tokenizer.decode(ids, skip_special_tokens=True)
                )
                messages.append({"role": "assistant", "content": text})
            prompt, specials = self._reward_prompt, self.tokenizer.all_special_tokens
            self._reward_trajectory = {
                "messages": messages[:prompt] + [_clean(m, specials) for m in messages[prompt:]],
                "tools": list(getattr(agent_data, "_active_tool_schemas", self.tool_schemas)),
            }
            return state

    TrajectoryToolAgentLoop.__module__ = __name__  # found again by name (Ray pickles it)
    TrajectoryToolAgentLoop.__qualname__ = TrajectoryToolAgentLoop.__name__
    return TrajectoryToolAgentLoop


def _clean(message: dict[str, Any], specials: list[str]) -> dict[str, Any]:
    """A message of the policy's turns: an assistant's with the tokenizer's special tokens
    (``specials``), and the white space around them, taken out of its content; a tool result
    as it is."""
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, str):
        return message
    for token in specials:
        content = content.replace(token, "")
    return {**message, "content": content.strip()}
