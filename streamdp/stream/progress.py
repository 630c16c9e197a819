"""Progress bars of the stream engine and the run driver: :mod:`streamdp.progress` (one module for every bar).

Kept so that ``streamdp.stream.progress`` still names them; storage code imports
:mod:`streamdp.progress` directly (storage does not import the stream layer).
"""

from streamdp.progress import enabled, progress, quiet

__all__ = ["progress", "quiet", "enabled"]
