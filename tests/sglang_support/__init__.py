"""Stand-ins for an SGLang server and SGLang's gateway (sgl-router): SGLang cannot run on this CPU machine."""
