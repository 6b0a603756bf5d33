CREATE TABLE schools (id INTEGER PRIMARY KEY, name TEXT, charter INTEGER, enrolled INTEGER);
INSERT INTO schools VALUES (1, 'Oak High', 1, 900), (2, 'Pine Elementary', 0, 300), (3, 'Elm Middle', 1, 450);
