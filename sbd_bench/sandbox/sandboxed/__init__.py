"""Code that runs inside the sandbox, shipped there as text by ``sbd_bench.sandbox.jobs``: the launcher
(``launcher.py``, never imported) and both ends of a judged session's pipe (``proxy.py``; importable, for
its tests). Neither imports anything of ours: the sandbox's interpreter has only the standard library.
"""
