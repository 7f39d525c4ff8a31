"""gRPC front end: inference.GRPCInferenceService and grpc.health.v1.Health."""
