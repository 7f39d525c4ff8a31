"""config.pbtxt: parsing into tritonclient's ModelConfig message, Triton's defaults, validation, JSON rendering."""

from tritonclient.grpc import model_config_pb2 as pb

ModelConfig = pb.ModelConfig

__all__ = ["ModelConfig", "pb"]
