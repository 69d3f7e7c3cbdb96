"""Multi-turn agents: environments, tools and tool-call formats (the multi_turn rollout that runs
them is `upslope.rollout.multi_turn`). See docs/agents.md."""
from upslope.agents import builtin_tools, formats  # noqa: F401  (register the built-in tools and formats)
from upslope.agents.env import AnswerEnv, Environment, Message, StepResult
from upslope.agents import socratic  # noqa: F401,E402  (registers the SocraticPO environment)
from upslope.agents.tools import ToolBox, ToolCall, call_tool, tool_schema

__all__ = ["AnswerEnv", "Environment", "Message", "StepResult", "ToolBox", "ToolCall", "call_tool", "tool_schema"]
