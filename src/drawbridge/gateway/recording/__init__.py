"""The evidence recorder: the trace chain, surface records and truth carriers written for every call
before it is answered, and the key of the truth producer."""
