CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, age INTEGER);
INSERT INTO singer VALUES (1, 'Ann', 45), (2, 'Bo', 30), (3, 'Cy', 52);
