"""Real sentences on three distinct topics for the text-only shard tests: cooking and astronomy
(written here) and the Python language (the reference manual text that CPython ships in
``pydoc_data.topics``). No download."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa

COOKING = """
Bring a large pot of salted water to a rolling boil before adding the pasta.
Sear the steak in a hot cast iron pan for three minutes on each side.
Let the dough rest in the refrigerator for at least an hour before rolling it out.
Whisk the eggs with a pinch of salt until the yolks and whites are fully combined.
Fresh basil should be torn by hand rather than chopped to keep it from bruising.
A good risotto needs warm stock added one ladle at a time while you stir.
Roast the garlic cloves in olive oil until they turn soft and golden.
Season the soup with salt and pepper, then taste it again before serving.
Caramelize the onions slowly over low heat for about forty minutes.
The bread is done when the loaf sounds hollow as you tap the bottom.
Marinate the chicken thighs overnight in yogurt, lemon juice and spices.
Fold the whipped cream gently into the chocolate so the mousse stays light.
Toast the cumin seeds in a dry skillet until they release their aroma.
Blanch the green beans in boiling water and plunge them into ice water.
A pinch of sugar balances the acidity of a tomato sauce.
Deglaze the pan with white wine and scrape up the browned bits.
Knead the bread dough for ten minutes until it becomes smooth and elastic.
Grate the parmesan cheese finely so it melts into the sauce.
Simmer the beef stew for three hours until the meat is tender.
Brush the pie crust with beaten egg to give it a golden shine.
Rinse the rice several times until the water runs clear.
Slice the cucumbers thinly and salt them to draw out their water.
Preheat the oven to two hundred degrees before baking the cookies.
Stir the custard constantly so that it does not curdle.
Chop the parsley, mint and coriander for a fresh herb salad.
The pancake batter should rest for a few minutes before cooking.
Squeeze half a lemon over the grilled fish just before serving.
Melt the butter in a saucepan and add the flour to make a roux.
Peel the potatoes and cut them into even pieces so they cook at the same rate.
Add the spinach at the end so that it wilts without losing its color.
A sharp knife is safer in the kitchen than a dull one.
Reduce the balsamic vinegar until it turns syrupy and sweet.
Cover the pot and let the lentils cook until they are soft.
Dust the counter with flour before you roll out the pastry.
Beat the butter and sugar together until the mixture is pale and fluffy.
Fry the shallots until crisp and drain them on a paper towel.
Serve the curry with steamed basmati rice and warm flatbread.
The sauce will thicken as it cools, so do not reduce it too far.
Soak the dried beans in cold water overnight before cooking them.
Crack the pepper coarsely for a steak au poivre.
Roll the sushi rice tightly in the seaweed sheet using a bamboo mat.
Poach the eggs in barely simmering water with a splash of vinegar.
Mix the ground lamb with onion, garlic and chopped mint for the kebabs.
Let the roast rest for fifteen minutes before carving it.
Sprinkle sea salt over the caramel just before it sets.
Steam the dumplings for eight minutes over boiling water.
Stir a spoonful of miso paste into the broth at the end.
Bake the lasagna until the cheese on top bubbles and browns.
Cut the cold butter into the flour until it looks like coarse crumbs.
Add a splash of pasta water to help the sauce cling to the noodles.
Glaze the carrots with honey and butter in a wide pan.
Skim the foam from the surface of the stock as it simmers.
Grind the spices in a mortar and pestle for a fresher flavor.
Toss the salad with the vinaigrette only at the last moment.
Chill the cookie dough so the cookies keep their shape in the oven.
Brown the mushrooms in batches so they do not steam in the pan.
Pour the batter into a greased tin and smooth the top with a spatula.
Baste the turkey with its juices every half hour.
Zest the orange before you juice it.
Crush the tomatoes by hand for a rustic sauce.
Ferment the cabbage with salt in a jar for two weeks to make sauerkraut.
Simmer the apples with cinnamon and a little sugar to make a compote.
Dice the onion finely so that it melts into the sauce.
Braise the short ribs in red wine with carrots and celery.
Fill the tart shell with pastry cream and arrange the berries on top.
Use a thermometer to check that the chicken has reached a safe temperature.
Cook the polenta slowly, stirring often, until it pulls away from the pot.
The yeast should foam in warm water before you add it to the flour.
Spread the hummus on a plate and drizzle it with olive oil.
Grill the corn until the kernels are charred in spots.
Add the cream off the heat so that the sauce does not split.
Stuff the peppers with rice, herbs and minced meat and bake them.
Sift the flour and cocoa together before folding them into the eggs.
Sauté the garlic briefly because it burns quickly and turns bitter.
Line the baking tray with parchment paper to stop the meringues from sticking.
Cure the salmon with salt, sugar and dill for two days.
Knead the pasta dough until it is silky, then roll it into thin sheets.
Temper the chocolate so that it sets with a glossy finish.
Heat the oil until it shimmers before adding the vegetables to the wok.
Garnish the soup with a swirl of cream and some chopped chives.
"""

ASTRONOMY = """
The Andromeda galaxy is the nearest large spiral galaxy to the Milky Way.
A light year is the distance that light travels in one year.
Jupiter is the largest planet in the solar system and has dozens of moons.
The Sun converts hydrogen into helium through nuclear fusion in its core.
Saturn's rings are made mostly of ice particles with some rocky debris.
A neutron star is the collapsed core of a massive star after a supernova.
Black holes bend light so strongly that nothing can escape from inside the event horizon.
The Moon always shows the same face to the Earth because of tidal locking.
Mars has the tallest volcano in the solar system, Olympus Mons.
Comets grow bright tails of gas and dust when they approach the Sun.
The Hubble Space Telescope has observed galaxies billions of light years away.
Venus is the hottest planet because its thick atmosphere traps heat.
Astronomers measure the distance to nearby stars using parallax.
The cosmic microwave background is the afterglow of the early universe.
Red giants are stars that have exhausted the hydrogen in their cores.
Exoplanets are often detected when they pass in front of their host star.
The Milky Way contains hundreds of billions of stars.
A solar eclipse happens when the Moon passes between the Earth and the Sun.
The asteroid belt lies between the orbits of Mars and Jupiter.
Pulsars emit beams of radio waves that sweep past the Earth like a lighthouse.
Galaxies are moving away from each other as the universe expands.
Neptune was discovered through mathematical predictions based on the orbit of Uranus.
The Orion Nebula is a stellar nursery where new stars are forming.
White dwarfs are the dense remnants of stars like the Sun.
The Voyager probes have travelled beyond the heliosphere into interstellar space.
Dark matter does not emit light but reveals itself through its gravity.
Meteor showers occur when the Earth passes through the debris left by a comet.
The James Webb Space Telescope observes the universe in infrared light.
Titan, the largest moon of Saturn, has lakes of liquid methane.
A supernova can briefly outshine an entire galaxy.
The planets orbit the Sun in nearly the same plane, called the ecliptic.
Quasars are powered by supermassive black holes at the centers of distant galaxies.
Europa may hide a liquid water ocean beneath its icy crust.
Binary stars orbit a common center of mass.
The redshift of a galaxy tells astronomers how fast it is receding.
Uranus rotates on its side with an axial tilt of almost ninety degrees.
The Kuiper belt is a region of icy bodies beyond the orbit of Neptune.
Sunspots are cooler regions on the surface of the Sun caused by magnetic activity.
Light from distant stars can take thousands of years to reach our telescopes.
Gravitational waves were first detected from two merging black holes.
Mercury has almost no atmosphere and its temperature swings wildly.
The Big Bang theory describes the expansion of the universe from a hot dense state.
Globular clusters are dense groups of very old stars orbiting a galaxy.
The Great Red Spot on Jupiter is a storm larger than the Earth.
An astronomical unit is the average distance between the Earth and the Sun.
Radio telescopes can observe the sky even through clouds.
Stars are born inside cold clouds of gas and dust that collapse under gravity.
The phases of the Moon depend on how much of its sunlit side we can see.
Pluto was reclassified as a dwarf planet in 2006.
Spiral galaxies have arms where young blue stars are concentrated.
The Magellanic Clouds are small galaxies that orbit the Milky Way.
Planetary nebulae are shells of gas thrown off by dying stars.
The Earth's axial tilt causes the seasons.
Astronomers use spectroscopy to learn what stars are made of.
The Sun is about four and a half billion years old.
A lunar eclipse occurs when the Earth's shadow falls on the Moon.
Io is the most volcanically active body in the solar system.
The nearest star to the Sun is Proxima Centauri.
Interstellar space is filled with a very thin gas of hydrogen and helium.
The mass of a star determines how long it will live.
Enceladus sprays jets of water vapor from cracks near its south pole.
The observable universe is about ninety-three billion light years across.
Elliptical galaxies contain mostly old stars and little gas.
Gamma-ray bursts are the most energetic explosions observed in the universe.
The solar wind is a stream of charged particles flowing out from the Sun.
Auroras appear when solar particles collide with gases in the upper atmosphere.
Variable stars change in brightness over hours, days or years.
The Hertzsprung-Russell diagram plots the luminosity of stars against their temperature.
Cepheid variables allowed astronomers to measure distances to other galaxies.
The rings of Uranus are dark and narrow.
Ganymede is larger than the planet Mercury.
Most stars in the galaxy are small, cool red dwarfs.
An accretion disk forms when matter spirals toward a black hole.
The Oort cloud is thought to be the source of long-period comets.
Telescopes on mountaintops avoid much of the blurring caused by the atmosphere.
A galaxy cluster can contain thousands of galaxies bound by gravity.
The rotation curves of galaxies suggest the presence of dark matter.
Phobos and Deimos are the two small moons of Mars.
Stellar winds carry heavy elements from dying stars back into space.
The first exoplanet around a Sun-like star was found in 1995.
"""


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in text.strip().splitlines() if s.strip()]


def python_sentences(n: int) -> list[str]:
    """``n`` sentences of 8-40 words from the Python reference manual shipped with CPython."""
    from pydoc_data.topics import topics

    out, seen = [], set()
    for key in sorted(topics):
        for s in re.split(r"(?<=[.!?])\s+", " ".join(topics[key].split())):
            words = s.split()
            if 8 <= len(words) <= 40 and s[0].isupper() and s.endswith(".") and s not in seen:
                seen.add(s)
                out.append(s)
                if len(out) == n:
                    return out
    return out


def text_shard(n_python: int = 160, favoured: str = "cooking", seed: int = 0) -> pa.Table:
    """A text-only shard: ``chunk_id``, ``quality_score`` (high for the ``favoured`` topic),
    ``topic``, ``text``, rows shuffled: 80 cooking, 80 astronomy and ``n_python`` Python
    sentences (320 rows by default)."""
    topics = {"cooking": _sentences(COOKING), "astronomy": _sentences(ASTRONOMY),
              "python": python_sentences(n_python)}
    assert [len(v) for v in topics.values()] == [80, 80, n_python]
    rng = np.random.default_rng(seed)
    texts, names = [], []
    for name, sents in topics.items():
        texts += sents
        names += [name] * len(sents)
    names = np.array(names)
    q = np.where(names == favoured, rng.uniform(0.8, 1.0, len(names)),
                 rng.uniform(0.0, 0.3, len(names)))
    order = rng.permutation(len(texts))
    return pa.table({
        "chunk_id": pa.array(np.arange(len(texts), dtype=np.int64) + 1000),
        "quality_score": pa.array(q[order]),
        "topic": pa.array(names[order].tolist()),
        "text": pa.array([texts[i] for i in order]),
    })
