"""Operations: what operators see and do (``locks``) and the command line (``cli``)."""
