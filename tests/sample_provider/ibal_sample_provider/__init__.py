"""A loopback HCA for ibal: the template for provider authors.

The package is laid out along the contract, one file per role:

* ``plugin.py``: the entry-point hook that tells ibal the provider exists;
* ``provider.py``: the :class:`~ibal.ci.Provider`: finds devices, registers CAs;
* ``ca.py``: the :class:`~ibal.ci.ChannelInterface`: every verb of one CA;
* ``handles.py``, ``memory.py``, ``queues.py``: the objects the verbs manage;
* ``loopback.py``: the data path, what the adapter does with posted work.

``docs/writing-a-provider.md`` in the ibal repository walks through it.
"""

from ibal_sample_provider.ca import CAPABILITIES, SampleCa
from ibal_sample_provider.provider import SampleProvider

__version__ = "0.1.0"

__all__ = ["CAPABILITIES", "SampleCa", "SampleProvider", "__version__"]
