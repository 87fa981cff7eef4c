"""What a policy counts and matches, read from a request: the key kinds (`keykinds`, and
what operators write for them in `keysyntax`), the client's identity (`identity`: the IP
behind trusted proxies, the user, a header), path patterns (`paths`) and override
matches (`overrides`).

Below the models and the settings (both validate what an operator writes with these
parsers) and above the engine; nothing here imports Django.
"""
