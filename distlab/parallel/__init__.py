"""Model parallelism for the GPT: FSDP2 sharding and sharded-checkpoint export."""

from distlab.parallel.fsdp2 import apply_fsdp2, export_consolidated, full_state_dict, is_fsdp2, parse_dtype

__all__ = ["apply_fsdp2", "export_consolidated", "full_state_dict", "is_fsdp2", "parse_dtype"]
