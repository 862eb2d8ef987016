"""Public test kit: fake model servers on real sockets that record what they saw.

The fakes run on trio and h11, bind 127.0.0.1 on a free port, and follow the trio clock (use
``autojump_clock`` in tests).  They record, per request, when the client disconnected, so tests
can assert that a cancel really closed the HTTP stream.  Plans exist for OpenAI chat
completions (:func:`openai_stream`), the OpenAI Responses API (:func:`responses_stream`, on the
OpenAI server) and Anthropic Messages (:func:`anthropic_stream`, on
:func:`open_fake_anthropic_server`, whose base URL has no ``/v1``); :func:`replay` sends
recorded bytes.  :func:`open_fake_realtime_server` is a fake OpenAI Realtime server on a real
WebSocket (see :mod:`trio_agents.testing.realtime`).
"""

from ._plans import replay as replay
from ._plans import sse_frame as sse_frame
from ._server import RECORDS_PATH as RECORDS_PATH
from ._server import ConnectionRecord as ConnectionRecord
from ._server import Ending as Ending
from ._server import FakeServer as FakeServer
from ._server import RequestRecord as RequestRecord
from ._server import Responder as Responder
from ._server import ResponsePlan as ResponsePlan
from ._server import open_fake_server as open_fake_server
from ._server import serve_fake_server as serve_fake_server
from .anthropic import anthropic_error as anthropic_error
from .anthropic import anthropic_stream as anthropic_stream
from .anthropic import open_fake_anthropic_server as open_fake_anthropic_server
from .anthropic import serve_fake_anthropic_server as serve_fake_anthropic_server
from .openai import open_fake_openai_server as open_fake_openai_server
from .openai import openai_error as openai_error
from .openai import openai_stream as openai_stream
from .openai import serve_fake_openai_server as serve_fake_openai_server
from .realtime import FakeRealtimeServer as FakeRealtimeServer
from .realtime import RealtimeReply as RealtimeReply
from .realtime import open_fake_realtime_server as open_fake_realtime_server
from .responses import responses_stream as responses_stream
