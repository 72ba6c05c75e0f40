from distlab.data.corpus import TokenSplits, load_corpus
from distlab.data.datamodule import TextDataModule
from distlab.data.digits import DigitsDataModule
from distlab.data.micro_shards import MicroShards
from distlab.data.tokenizer import ByteTokenizer

__all__ = ["ByteTokenizer", "DigitsDataModule", "MicroShards", "TextDataModule", "TokenSplits", "load_corpus"]
