"""kvoffload: is vLLM CPU KV offloading paying off, and how big should it be?"""

__version__ = "0.1.0"
