"""Multi-turn agents: environments, tools, tool-call formats and the multi_turn rollout.
See docs/agents.md."""
from upslope.agents import builtin_tools, formats  # noqa: F401  (register the built-in tools and formats)
from upslope.agents.env import AnswerEnv, Environment, Message, StepResult
from upslope.agents import socratic  # noqa: F401,E402  (registers the SocraticPO environment)
from upslope.agents.rollout import AgentRun, multi_turn
from upslope.agents.tools import ToolBox, ToolCall, call_tool, tool_schema

__all__ = ["AgentRun", "AnswerEnv", "Environment", "Message", "StepResult", "ToolBox", "ToolCall", "call_tool",
           "multi_turn", "tool_schema"]
