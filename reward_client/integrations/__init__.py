"""The reward client inside RL frameworks, each importing its framework only when used.

- :mod:`reward_client.integrations.trl`: :class:`~reward_client.integrations.trl.RemoteReward`,
  a ``reward_funcs`` entry of TRL's GRPOTrainer and RLOOTrainer.
- :mod:`reward_client.integrations.verl`: verl's ``custom_reward_function``
  (``path=pkg://reward_client.integrations.verl``), and
  :mod:`reward_client.integrations.verl_agent`: verl's tool agent loop recording the
  agent's trajectory for it.
- :mod:`reward_client.integrations.openrlhf`: a ``reward_func`` file for OpenRLHF's
  ``--remote_rm_url``.
- :mod:`reward_client.integrations.verifiers`: Prime Intellect's verifiers (0.4): a reward
  function (:class:`~reward_client.integrations.verifiers.ServerReward`) and a rubric of the
  server's models (:class:`~reward_client.integrations.verifiers.ServerRubric`) for its tasks.

Shared: :mod:`~reward_client.integrations.messages` (the frameworks' chat messages as OpenAI
chat messages, tool calls and results kept), :mod:`~reward_client.integrations.tools` (tools
as OpenAI function specs),
:mod:`~reward_client.integrations.settings` (settings from keyword arguments and the
environment, clients kept for the process) and :mod:`~reward_client.integrations.masks`
(what an item the server masked becomes: None for TRL, a fill value with a warning for verl
and OpenRLHF, which have no notion of a sample without a reward).
"""
