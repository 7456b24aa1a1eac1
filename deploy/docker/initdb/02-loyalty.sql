-- The example consumer's own database; it creates its tables itself (--create-schema).
CREATE DATABASE loyalty;
