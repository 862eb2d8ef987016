"""Tools from MCP servers (the Model Context Protocol), as ordinary agent tools.

``MCPServer.stdio(command, args)`` or ``MCPServer.http(url)`` goes in an agent's ``tools=[...]``;
the runner opens the server (one session shared by every invocation) and closes it after the
last invocation.  A cancel of the invocation reaches the server before ``wait()`` returns.  An
adapter like :mod:`trio_agents.models`: it knows nothing of agents beyond the tool protocol.
"""

from .._exceptions import MCPServerError as MCPServerError
from ._server import MCPServer as MCPServer
from ._tool import MCPTool as MCPTool
from ._tool import ToolPolicy as ToolPolicy
