"""Public test kit: fake model servers on real sockets that record what they saw.

The fakes run on trio and h11, bind 127.0.0.1 on a free port, and follow the trio clock (use
``autojump_clock`` in tests).  They record, per request, when the client disconnected, so tests
can assert that a cancel really closed the HTTP stream.
"""

from ._server import ConnectionRecord as ConnectionRecord
from ._server import Ending as Ending
from ._server import FakeServer as FakeServer
from ._server import RequestRecord as RequestRecord
from ._server import Responder as Responder
from ._server import ResponsePlan as ResponsePlan
from ._server import open_fake_server as open_fake_server
from ._server import serve_fake_server as serve_fake_server
from .openai import open_fake_openai_server as open_fake_openai_server
from .openai import openai_error as openai_error
from .openai import openai_stream as openai_stream
from .openai import replay as replay
from .openai import serve_fake_openai_server as serve_fake_openai_server
from .openai import sse_frame as sse_frame
