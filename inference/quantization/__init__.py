"""Weight-only integer quantization (RTN, GPTQ, AWQ) as a transform on a built model, and the
GPTQ / AWQ checkpoint formats on disk. See config.py for what each method stores."""
