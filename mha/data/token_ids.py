"""The vocabulary's fixed special ids, shared by every layer.

The SentencePiece model (`mha.data.tokenizer`) is trained with these ids;
the search (`mha.search.decoding`), the translate layer and the export read them
here without importing the data package. There is no BOS: the decoder
starts from PAD.
"""
PAD_ID = 0
EOS_ID = 1
UNK_ID = 2
