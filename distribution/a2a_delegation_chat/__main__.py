"""`python -m a2a_delegation_chat`: the same as the console script `a2a-delegation-chat`."""

from a2a_delegation_chat import main

if __name__ == "__main__":
    main()
